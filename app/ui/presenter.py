"""Presenter mode: large type for a projector, and stepping through a run from the keyboard.

The page's own script and style, given once at launch (Gradio's `head` and `css`). The class `sd-presenting` on
<body> turns it on (the Run tab's "Presenter mode" box, or a link's `present=1`); then the page's title, the tab row,
the controls column and the token view's legend hide (C or the "controls" button shows them), → and ← move the
"Inspect step" slider, whose change draws the step's detail and narration as a click would, and space plays the run
step by step at the chosen pace, or pauses it. One screen (1280x720 and up) holds the bar of buttons, the status line,
the token view, the slider and the inspected step's narration, however long the run: the token view is a box of the
height the others leave, scrolled to the inspected step, and the page scrolls to them (`frame`). The inspected step is
outlined in the token view, presenting or not; an EAGLE or Medusa step's draft tree takes the width the hidden
controls leave (up to 70 % of the screen's height).
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
    frame(shown);
  };
  // Presenting, one screen holds the bar, the status line, the token view, the slider and the inspected step's
  // heading and narration, however long the run: the token view gets the height the others leave (room kept for
  // a narration of four lines) and scrolls itself to the step; the page scrolls to the status line, or, where the
  // screen is too short for it, to the token view. Only when the step changes or a run's update redraws the view or
  // the status: a chart redrawn, or the lecturer scrolling down to the draft tree, moves nothing.
  let framed = {step: null, view: null, said: null};
  const frame = (shown, again = false) => {
    const view = document.querySelector("#step-view .sd-view");
    const step = shown === null ? null : view?.querySelector(`.step[data-step="${shown}"]`);
    const status = document.querySelector("#status"), head = document.querySelector("#step-detail h4");
    if (!step || !status || !head || !document.body.classList.contains("sd-presenting")) return;
    const said = status.querySelector(".prose")?.textContent ?? "";
    const drawn = again || view !== framed.view || said !== framed.said;
    const moved = again || shown !== framed.step;
    if (!moved && !drawn) return;
    framed = {step: shown, view, said};
    const bar = (document.querySelector("#present-bar")?.offsetHeight ?? 0) + 8;
    if (drawn) {
      const rem = parseFloat(getComputedStyle(document.documentElement).fontSize) || 16;
      const s = status.getBoundingClientRect(), v = view.getBoundingClientRect(), h = head.getBoundingClientRect();
      const room = innerHeight - bar - (v.top - s.top) - (h.top - v.bottom) - 12 * rem;
      document.body.style.setProperty("--sd-view-room", `${Math.floor(Math.max(10 * rem, room))}px`);
    }
    const box = view.getBoundingClientRect(), at = step.getBoundingClientRect();
    // A third of the way down, or higher for a step of several lines: all of it in the box.
    const ahead = Math.max(0, Math.min(box.height / 3, box.height - at.height - 4));
    if (at.top < box.top || at.bottom > box.bottom) view.scrollTop += at.top - box.top - ahead;
    const narration = document.querySelector("#step-detail .sd-narration") ?? head;
    const s = status.getBoundingClientRect(), v = view.getBoundingClientRect(), n = narration.getBoundingClientRect();
    const from = n.bottom - s.top <= innerHeight - bar ? s.top : v.top;
    if (from < bar || n.bottom > innerHeight) window.scrollBy(0, from - bar);
  };
  window.sdFrame = () => frame(detailed(), true);
  addEventListener("resize", () => window.sdFrame());
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
# While presenting, the page's title, the tab row and the controls column give their height to the run (C shows
# them again); the token view is a box of its own height, scrolled to the inspected step by the script above, so
# that the step and its narration under it share one screen however long the run; the bar of buttons stays at the
# top. The rules on Gradio's own elements (the title's block, the tab row, the forms) name them by structure: they
# have no ids of their own.
CSS = """
body:not(.sd-presenting) #presenter-row { display: none; }
body.sd-presenting:not(.sd-controls) #controls-col,
body.sd-presenting:not(.sd-controls) #step-view .legend { display: none; }
body.sd-presenting:not(.sd-controls) main.contain > .column > .block:has(h1),
body.sd-presenting:not(.sd-controls) main.contain > .column > .tabs > .tab-wrapper { display: none; }
body .specdec .step.sd-inspected { outline: 3px solid #E69F00; outline-offset: 2px; border-radius: 3px; }
/* Gradio's container hides its overflow, which makes it the bar's scroll container and the bar never sticks; clip cuts
   the same without being one. Gradio sets the forms' flex-grow inline: only !important moves it. */
body.sd-presenting .gradio-container { overflow: clip; }
body.sd-presenting #present-bar { position: sticky; top: 0; z-index: 20; background: var(--body-background-fill);
  flex-wrap: nowrap; align-items: center; gap: .5rem; padding: .25rem 0; }
body.sd-presenting #present-bar > .form { flex: 1 1 0 !important; border: none; }
body.sd-presenting #present { padding: .2rem .4rem; }
body.sd-presenting #present label { font-size: .9rem; line-height: 1.25; }
body.sd-presenting #presenter-row { flex: 0 0 auto; width: auto; flex-wrap: nowrap; align-items: center;
  justify-content: flex-end; gap: .4rem; }
body.sd-presenting #presenter-row > button, body.sd-presenting #presenter-row > .form { flex: 0 0 auto !important; border: none; }
body.sd-presenting #presenter-row > button { font-size: 1rem; white-space: nowrap; padding: .3rem .7rem; }
body.sd-presenting #pace { padding: .2rem .4rem; }
body.sd-presenting #pace label { display: flex; align-items: center; gap: .4rem; margin: 0; }
body.sd-presenting #pace label > span { margin: 0; white-space: nowrap; }
body.sd-presenting #pace input { width: 4.5rem; padding: .2rem .4rem; }
body.sd-presenting #status, body.sd-presenting #status p, body.sd-presenting #status li { font-size: 1.35rem; line-height: 1.45; }
body.sd-presenting #step { padding: .3rem .8rem; }
body.sd-presenting #tour-note p { font-size: 1.15rem; line-height: 1.4; }
body.sd-presenting #step-view .specdec, body.sd-presenting #step-detail .specdec { font-size: 1.45rem; line-height: 1.7; }
body.sd-presenting #step-view .sd-view { max-height: var(--sd-view-room, max(10rem, calc(100vh - 25rem))); overflow-y: auto;
  overscroll-behavior: contain; padding: 0 .3rem; }
body.sd-presenting #step-detail .sd-narration { font-size: 1.5rem; line-height: 1.35; font-weight: 600;
  border-left: .35rem solid #E69F00; padding: .3rem .8rem; margin: .4rem 0 .8rem; }
body.sd-presenting .specdec .tok-accepted { outline: 2px solid currentColor; }
body.sd-presenting .specdec .tok-rejected { text-decoration-thickness: 3px; }
body.sd-presenting .specdec .sd-tree { max-height: none; }
body.sd-presenting .specdec .sd-tree-svg { width: 100%; height: auto; max-height: 70vh; }
"""

# The page's layout changes at once: the inspected step is framed again on the next frame.
TOGGLE_JS = ("(on) => { document.body.classList.toggle('sd-presenting', !!on); "
             "requestAnimationFrame(() => window.sdFrame?.()); }")
