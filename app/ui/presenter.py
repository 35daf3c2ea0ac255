"""Presenter mode: large type for a projector, and stepping through a run from the keyboard.

The page's own script and style, given once at launch (Gradio's `head` and `css`). The class `sd-presenting` on
<body> turns it on (the Run tab's "Presenter mode" box, or a link's `present=1`); then the controls column hides
with the token view's legend (C or the "controls" button shows both), → and ← move the "Inspect step" slider,
whose change draws the step's detail and narration as a click would, and space plays the run step by step at the
chosen pace, or pauses it. The inspected step is outlined in the token view, presenting or not; an EAGLE or Medusa
step's draft tree takes the width the hidden controls leave (up to 70 % of the screen's height).
"""

HEAD = r"""<script>
(() => {
  const field = (id, type) => document.querySelector(`#${id} input[type="${type}"]`);
  // Step the "Inspect step" slider as a user would: type the number and press Enter (what Gradio listens to).
  // Returns the step asked for, or null at either end.
  window.sdStep = (delta) => {
    const range = field("step", "range"), box = field("step", "number");
    if (!range || !box || range.disabled) return null;
    const next = Math.min(+range.max, Math.max(+range.min, +range.value + delta));
    if (next === +range.value) return null;
    box.value = String(next);
    box.dispatchEvent(new Event("input", {bubbles: true}));
    box.dispatchEvent(new KeyboardEvent("keydown", {key: "Enter", bubbles: true}));
    box.dispatchEvent(new Event("blur", {bubbles: true}));
    return next;
  };
  // The step whose detail is drawn ("Step 7 · decode"), as text, or null.
  const detailed = () => /^Step (\d+) /.exec(document.querySelector("#step-detail h4")?.innerText || "")?.[1] ?? null;
  const drawn = (n) => detailed() === String(n);
  let timer = null;
  window.sdPlaying = () => timer !== null;
  // Play waits for each step to be drawn before its pace starts: each step is a server round trip, and Gradio
  // runs only the latest of the changes it has not started yet, so stepping faster than the server draws
  // would skip steps on a loaded server. A step not drawn within 20 s is passed over.
  window.sdPlay = () => {
    if (timer !== null) { clearTimeout(timer); timer = null; return false; }
    const shown = (n, waited) => {
      timer = (drawn(n) || waited >= 20000) ? setTimeout(tick, pace()) : setTimeout(() => shown(n, waited + 100), 100);
    };
    const pace = () => Math.max(0.2, +(field("pace", "number")?.value || 1.5)) * 1000;
    const tick = () => { const n = window.sdStep(1); if (n === null) timer = null; else shown(n, 0); };
    timer = setTimeout(tick, pace());
    return true;
  };
  window.sdControls = () => document.body.classList.toggle("sd-controls");
  // The inspected step, marked in the token view: the one whose detail is shown below it.
  const mark = () => {
    const shown = detailed();
    document.querySelectorAll("#step-view .step.sd-inspected").forEach((e) => {
      if (e.dataset.step !== shown) e.classList.remove("sd-inspected");
    });
    if (shown !== null) document.querySelector(`#step-view .step[data-step="${shown}"]`)?.classList.add("sd-inspected");
  };
  new MutationObserver(mark).observe(document.documentElement, {subtree: true, childList: true, characterData: true});
  document.addEventListener("keydown", (e) => {
    if (!document.body.classList.contains("sd-presenting") || e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    if (t && (t.tagName === "TEXTAREA" || t.isContentEditable ||
              (t.tagName === "INPUT" && !["checkbox", "radio", "range", "button"].includes(t.type)))) return;
    const act = {ArrowRight: () => window.sdStep(1), ArrowLeft: () => window.sdStep(-1), " ": () => window.sdPlay(),
                 c: () => window.sdControls(), C: () => window.sdControls()}[e.key];
    if (act) { e.preventDefault(); act(); }
  });
})();
</script>"""

# Readable from the back of a room at 1280x720: the step view, its detail and narration, and the status line.
# Every rule starts at <body>: Gradio also adds a copy of each rule scoped inside its container, more specific
# than the plain one, and a bare `#presenter-row { display: none }` copy would win over the presenting rule.
CSS = """
body:not(.sd-presenting) #presenter-row { display: none; }
body.sd-presenting:not(.sd-controls) #controls-col, body.sd-presenting:not(.sd-controls) #step-view .legend { display: none; }
body .specdec .step.sd-inspected { outline: 3px solid #E69F00; outline-offset: 2px; border-radius: 3px; }
body.sd-presenting #status { font-size: 1.35rem; }
body.sd-presenting #step-view .specdec, body.sd-presenting #step-detail .specdec { font-size: 1.45rem; line-height: 1.7; }
body.sd-presenting #step-detail .sd-narration { font-size: 1.6rem; font-weight: 600; border-left: .35rem solid #E69F00;
  padding: .3rem .8rem; margin: .4rem 0 .8rem; }
body.sd-presenting .specdec .tok-accepted { outline: 2px solid currentColor; }
body.sd-presenting .specdec .tok-rejected { text-decoration-thickness: 3px; }
body.sd-presenting .specdec .sd-tree { max-height: none; }
body.sd-presenting .specdec .sd-tree-svg { width: 100%; height: auto; max-height: 70vh; }
"""

TOGGLE_JS = "(on) => { document.body.classList.toggle('sd-presenting', !!on); }"
