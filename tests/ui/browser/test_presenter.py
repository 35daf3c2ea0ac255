"""Presenter mode as one projector screen (1280x720) for a run of any length, in a real browser: the page's title, the
tab row and the controls give the run their height (C brings them back), the token view scrolls to the inspected
step, and that step's tokens and its narration are on the screen together, in large type, the status line's too.
A module of its own (its own app server), so the suite's two workers share the browser tests."""

import json

from helpers import ROOT, inspect_step, wait_status

EAGLE = "eagle-roleplay-bfloat16"  # 128 tokens in 39 target passes: the token view alone is taller than the screen

# What keeps step `n` and its narration from being read at once, as a list of sentences (empty: nothing does). Inside the
# window (getBoundingClientRect against innerWidth and innerHeight), below the bar that stays at the top, not cut by
# the token view's own scrolling, and not under anything else.
OFF_SCREEN = """n => {
  const out = [], W = innerWidth, H = innerHeight;
  const top = document.querySelector('#present-bar').getBoundingClientRect().bottom;
  const inside = (what, r) => {
    if (r.top < top - 0.5 || r.bottom > H + 0.5 || r.left < -0.5 || r.right > W + 0.5 || !r.height)
      out.push(`${what} at top ${r.top.toFixed(0)}, bottom ${r.bottom.toFixed(0)}, left ${r.left.toFixed(0)}, ` +
               `right ${r.right.toFixed(0)} in ${W}x${H} below the bar's ${top.toFixed(0)}`);
  };
  const step = document.querySelector(`#step-view .step[data-step="${n}"]`);
  const narration = document.querySelector('#step-detail .sd-narration');
  if (!step || !narration) return [`no step ${n} or no narration`];
  const shown = /^Step (\\d+) /.exec(document.querySelector('#step-detail h4')?.innerText || '');
  if (!shown || shown[1] !== String(n)) out.push(`the detail is not step ${n}'s`);
  if (!step.classList.contains('sd-inspected')) out.push('the step is not outlined');
  const r = step.getBoundingClientRect(), box = document.querySelector('#step-view .sd-view').getBoundingClientRect();
  inside(`step ${n}`, r);
  if (r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) out.push(`step ${n} is cut by the token view's scrolling`);
  const line = step.getClientRects()[0];
  const hit = document.elementFromPoint((line.left + line.right) / 2, (line.top + line.bottom) / 2);
  if (!step.contains(hit)) out.push(`step ${n} is under ${hit?.tagName}#${hit?.id}.${hit?.className}`);
  inside('its narration', narration.getBoundingClientRect());
  if (!narration.innerText.trim()) out.push('the narration is empty');
  return out;
}"""
SIZE = "s => parseFloat(getComputedStyle(document.querySelector(s)).fontSize)"


def on_screen(page, n):
    """Step `n` and its narration on the screen together, once the page has scrolled (else what keeps them apart)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"n => ({OFF_SCREEN})(n).length === 0", arg=n, timeout=10_000)
    except PlaywrightTimeout:
        pass
    assert page.evaluate(OFF_SCREEN, n) == [], n


def test_browser_presenting_a_long_run_keeps_the_inspected_step_and_its_narration_on_one_screen(page, app_url, screenshot):
    trace = json.loads((ROOT / "assets" / "traces" / f"{EAGLE}.json").read_text())
    assert len(trace["token_ids"]) == 128
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{app_url}/?present=1&replay={EAGLE}")
    wait_status(page, "Replayed a recording", timeout=300_000)
    # The page's title, the tab row and the controls column make room; the status line reads as large as the rest.
    assert not page.locator("h1").first.is_visible() and not page.get_by_role("tab", name="Compare").is_visible()
    assert not page.locator("#prompt").is_visible()
    assert page.evaluate(SIZE, "#status p") >= 20 and page.evaluate(SIZE, "#step-view .sd-text") >= 22
    assert page.evaluate(SIZE, "#step-detail .sd-narration") >= 24
    last = int(page.get_by_label("number input for Inspect step", exact=True).input_value())
    assert last == len(trace["steps"]) - 1
    # The view as it stands after the replay: its last step, narrated, with the status line above.
    on_screen(page, last)
    screenshot("presenter-eagle-end", full_page=False)
    for n in (1, 20, last):
        inspect_step(page, n)
        on_screen(page, n)
        screenshot(f"presenter-eagle-step-{n}", full_page=False)
    # From the keyboard as a lecturer steps: ← from the last step, then → back to it.
    page.evaluate("document.activeElement?.blur()")
    for key, n in (("ArrowLeft", last - 1), ("ArrowRight", last)):
        page.keyboard.press(key)
        page.wait_for_function("n => document.querySelector('#step-detail h4')?.innerText.startsWith(`Step ${n} `)", arg=n)
        on_screen(page, n)
    # C brings the title, the tabs and the controls back (and hides them again).
    page.keyboard.press("c")
    page.wait_for_function("document.body.classList.contains('sd-controls')")
    assert page.locator("h1").first.is_visible() and page.get_by_role("tab", name="Compare").is_visible()
    assert page.locator("#prompt").is_visible()
    page.keyboard.press("c")
    page.wait_for_function("!document.body.classList.contains('sd-controls')")
    assert not page.locator("h1").first.is_visible()
    # Not presenting, the page is as it was: its title and tabs, and the token view at its full height.
    page.uncheck("#present input")
    page.wait_for_function("!document.body.classList.contains('sd-presenting')")
    assert page.locator("h1").first.is_visible() and not page.locator("#presenter-row").is_visible()
    box = page.eval_on_selector("#step-view .sd-view", "e => [e.scrollHeight, e.clientHeight]")
    assert box[0] == box[1], box
