"""The Run tab for a lecture, in a real browser on the bundled model: a first click that shows speculation
earning, presenter mode stepped from the keyboard, shareable links, and the tour of every mode's recording.
A module of its own (its own app server), so the suite's two workers share the browser tests."""

import re
import subprocess
import sys

from helpers import PROMPT, RECORDINGS, busy_cores, inspect_step, set_number, wait_status


# ----------------------------------------------------------------------------- shareable links


def test_browser_link_sets_up_the_page_and_copy_link_gives_it_back(page, app_url):
    from app.prompts import load_prompts

    summarization = next(r["text"] for r in load_prompts(None, ["summarization"], 1))
    query = "mode=lookahead&example=241&la=5,3,2&dtype=float32"
    page.goto(f"{app_url}/?{query}")
    page.wait_for_function("document.querySelector('#mode input[value=lookahead]')?.checked")
    page.wait_for_function("t => document.querySelector('#prompt textarea').value === t", arg=summarization)
    assert page.input_value("#examples input").startswith("summarization")  # the menu says which example it is
    assert page.get_by_label("number input for max_window_size W", exact=True).input_value() == "5"
    assert page.get_by_label("number input for max_verification_set_size G", exact=True).input_value() == "2"
    assert page.locator("#dtype").get_by_label("float32", exact=True).is_checked()
    assert "max_window_size" in page.inner_text("#learn-mode") and page.inner_text("#link-note").strip() == ""
    page.click("#copy-link")
    page.wait_for_function("() => /\\?/.test(document.querySelector('#link textarea, #link input')?.value || '')")
    link = page.locator("#link textarea, #link input").first.input_value()
    assert link.startswith(app_url) and link.split("?", 1)[1] == "mode=lookahead&example=241&la=5%2C3%2C2&dtype=float32"
    page.goto(link)  # the copied link opens the same setup
    page.wait_for_function("document.querySelector('#mode input[value=lookahead]')?.checked")
    assert page.get_by_label("number input for max_window_size W", exact=True).input_value() == "5"


def test_browser_a_link_copied_after_a_live_run_opens_showing_that_run(page, app_url):
    """The issue's walk: Copy link after a live run opened the same settings on an empty page. Now the link says
    `run=1`, and opening it runs the setup, saying that a link carries settings, not the run."""
    page.click("text=Sampling and length")
    set_number(page, "max_new_tokens", 24)
    page.wait_for_function("() => [...document.querySelectorAll('input[aria-label=\"range slider for max_new_tokens\"]')]"
                           ".some(e => e.value === '24')")  # the page took the value (its range follows the box)
    page.click("#run")
    first = wait_status(page, VERDICT)
    assert "24 tokens" in first, first  # the run ran the setting the link is to carry
    page.click("#copy-link")
    page.wait_for_function("() => /\\?/.test(document.querySelector('#link textarea, #link input')?.value || '')")
    link = page.locator("#link textarea, #link input").first.input_value()
    assert "run=1" in link and "max_new_tokens=24" in link, link
    page.goto(link)
    status = wait_status(page, VERDICT)
    assert "24 tokens" in status and page.locator("#step-view .step").count() >= 2, status
    assert "runs its setup again on open" in page.inner_text("#link-note")


def test_browser_bad_link_parameters_get_a_note_not_an_error(page, app_url):
    page.goto(f"{app_url}/?mode=warp&la=99,1&tab=compare&pl_ngram=3")
    page.wait_for_function("/Link: ignored/.test(document.querySelector('#link-note')?.innerText || '')")
    note = page.inner_text("#link-note")
    assert "mode=warp" in note and "la=99,1" in note and "pl_ngram" not in note
    assert page.locator("#cmp-prompt").is_visible()  # tab=compare opened the Compare tab
    assert page.get_by_label("number input for max_matching_ngram_size", exact=True).input_value() == "3"


def test_browser_link_replays_a_recording(page, app_url):
    """A `?replay=` link replays the recording and sets the page up as it ran: its mode and its prompt (Run then
    runs the same thing here)."""
    from app import traces

    path = next(p for p in RECORDINGS if not p.stem.startswith(("autoregressive", "prompt_lookup")))  # not the defaults
    run, _ = traces.read(path)
    page.goto(f"{app_url}/?replay={path.stem}")
    status = wait_status(page, "finished|stopped")
    assert page.locator("#step-view .step").count() >= 2, status
    mode = path.stem.split("-")[0].split("+")[0]
    page.wait_for_function("m => document.querySelector(`#mode input[value=${m}]`)?.checked", arg=mode)
    assert page.input_value("#prompt textarea") == run.prompt
    wait_status(page, "Replayed a recording")  # its end: the page now holds the replayed record
    page.click("#copy-link")  # the link of what is shown replays it again
    page.wait_for_function("() => /replay=/.test(document.querySelector('#link textarea, #link input')?.value || '')")
    link = page.locator("#link textarea, #link input").first.input_value()
    assert f"replay={path.stem}" in link and f"mode={mode}" in link, link


def test_browser_run_and_its_status_are_in_the_first_screenful(page, app_url, screenshot):
    """A projector's 1280x720 and a laptop's 1440x900: Run and the status line it changes show without scrolling."""
    for width, height in ((1280, 720), (1440, 900)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(app_url)
        page.wait_for_selector("#run")
        for selector in ("#run", "#status"):
            box = page.locator(selector).bounding_box()
            assert box and 0 <= box["y"] and box["y"] + box["height"] <= height, (selector, width, height, box)
        screenshot(f"first-screen-{width}x{height}", full_page=False)


def test_browser_presenter_mode_steps_through_a_run_from_the_keyboard(page, app_url, screenshot):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{app_url}/?present=1&mode=suffix")
    page.wait_for_function("document.body.classList.contains('sd-presenting')")
    assert not page.locator("#prompt").is_visible()  # the controls column is hidden while presenting
    page.click("#status")
    page.keyboard.press("c")  # C brings the controls back
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(False)
    page.click("#present-controls")  # and hides them again
    assert not page.locator("#prompt").is_visible()
    page.click("#present-run")  # Run in the presenter row
    wait_status(page, "finished")
    last = int(page.get_by_label("number input for Inspect step", exact=True).input_value())
    assert last >= 3
    heading = "n => document.querySelector('#step-detail h4')?.innerText.startsWith(`Step ${n} `)"
    page.click("#status")  # focus off the inputs: the keys step the run
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(heading, arg=last - 1)
    # The inspected step is outlined in the token view, and only it.
    page.wait_for_function("n => [...document.querySelectorAll('#step-view .step.sd-inspected')].map(e => e.dataset.step).join() === String(n)",
                           arg=last - 1)
    screenshot("presenter", full_page=False)  # what a projector shows at 1280x720: the presenter row, status, tokens
    narration = page.inner_text("#step-detail .sd-narration")
    assert "target" in narration.lower() and len(narration) > 30
    big = page.eval_on_selector("#step-detail .sd-narration", "e => parseFloat(getComputedStyle(e).fontSize)")
    assert big >= 24  # reads from the back of a room
    page.evaluate("document.querySelector('#step-detail').scrollIntoView({block: 'start'})")
    screenshot("presenter-detail", full_page=False)  # the step's detail and narration, scrolled to
    page.keyboard.press("ArrowRight")
    page.wait_for_function(heading, arg=last)
    for key in ["ArrowLeft"] * 12 + ["ArrowRight"] * 8:  # 20 quick presses: the narration ends on the slider's step
        page.keyboard.press(key)
    settled = max(0, last - 12) + 8 if last >= 12 else min(last, 8)
    slider = "() => +document.querySelector('#step input[type=number]').value"
    assert page.evaluate(slider) == settled
    page.wait_for_function(heading, arg=settled, timeout=60_000)
    page.wait_for_timeout(1500)  # no older answer lands after it
    assert page.inner_text("#step-detail h4").startswith(f"Step {settled} ")
    inspect_step(page, 1)
    page.fill("#pace input", "0.3")  # the script reads the box as it plays
    page.click("#status")
    page.keyboard.press(" ")  # play: the steps advance on their own
    page.wait_for_function(heading, arg=3, timeout=60_000)  # each step is a round trip to a server the suite loads
    page.click("#step-play")  # pause
    page.click("#step-back")
    page.wait_for_function("() => /^Step \\d+ /.test(document.querySelector('#step-detail h4')?.innerText || '')")
    page.uncheck("#present input")
    page.wait_for_function("!document.body.classList.contains('sd-presenting')")
    assert not page.locator("#presenter-row").is_visible()


def test_browser_presenting_scales_an_eagle_tree_to_the_space(page, app_url):
    """At 1280x720 a replayed EAGLE run's draft tree takes the width the hidden controls leave, within the screen's
    height; not presenting, it keeps its own size."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{app_url}/?present=1&replay=eagle-roleplay-bfloat16")
    wait_status(page, "Replayed a recording", timeout=300_000)
    page.wait_for_selector("#step-detail .sd-tree-svg")
    size = "e => [e.width.baseVal.value, e.getBoundingClientRect().width, e.getBoundingClientRect().height]"
    natural, shown, tall = page.eval_on_selector("#step-detail .sd-tree-svg", size)
    room = page.eval_on_selector("#step-detail .sd-tree", "e => e.clientWidth")
    assert shown >= 0.95 * room and shown > natural and tall <= 0.7 * 720 + 1, (natural, shown, tall, room)
    page.uncheck("#present input")
    page.wait_for_function("!document.body.classList.contains('sd-presenting')")
    assert page.eval_on_selector("#step-detail .sd-tree-svg", size)[1] == natural


def test_browser_first_run_on_a_fresh_page_shows_speculation_earning(page):
    """The page's defaults as they are, on a machine busy with a stand-in for the one-time fast-pass build (both cores
    taken by other processes, as the build takes them on a new machine or Space): the first Run's status shows prompt
    lookup's τ and its speedup with its interval, the run and its baseline raced step by step under that same load.
    The counter-example is one click away.

    The first Run, not a later one: with both cores busy and the browser drawing on them too, a few of a race's steps
    on one side can take a burst of load (a fresh page's first race once read a step at 0.74 of an autoregressive one,
    withheld); a reading that its own spread carries back to the bound is taken there, with that spread."""
    with busy_cores():
        page.click("#run")
        wait_status(page, "finished")
        status = wait_status(page, VERDICT)  # the race's verdict comes with the end
    tau = float(re.search(r"τ (\d+\.\d+) tokens/pass after the prefill", status).group(1))
    assert tau >= 1.5, status
    found = re.search(r"after the prefill (\d+\.\d+)× \(95 % of the step times' spread: (\d+\.\d+)–(\d+\.\d+)×\)", status)
    assert found, status
    decoding, low, high = map(float, found.group(1, 2, 3))
    assert 1.2 < decoding <= tau and low <= decoding <= high <= tau, status
    assert "copies the paragraph" in page.inner_text("#prompt-why")
    page.click("#counter-example")  # the note follows the prompt: the counter-example's, then none for another text
    page.wait_for_function("/nothing in the prompt to copy/.test(document.querySelector('#prompt-why').innerText)")
    page.fill("#prompt textarea", "Write a haiku about autumn.")
    page.wait_for_function("!/Why this prompt/.test(document.querySelector('#prompt-why').innerText)")
    page.click("#counter-example")
    page.wait_for_function("/travel blog/i.test(document.querySelector('#prompt textarea').value)")


VERDICT = "autoregressive run's tokens/s|No speedup shown"


def race(page) -> str:
    """Run (prompt lookup racing autoregressive) and return the status line once its verdict is in."""
    page.click("#run")
    page.wait_for_function("/processing/.test(document.querySelector('#status')?.innerText || '')")
    page.wait_for_function(
        "p => { const s = document.querySelector('#status')?.innerText || ''; return !/processing/.test(s) && new RegExp(p).test(s); }",
        arg=VERDICT, timeout=300_000)
    return page.inner_text("#status")


def test_browser_a_speedup_measured_under_load_holds_when_repeated_quietly(page):
    """On a loaded machine: the race steps the run and its baseline in turn, so the decoding speedup printed while two
    busy processes compete for the cores is a result, and the same race repeated without them lies in its interval."""
    page.click("text=Sampling and length")  # the page's prompt (it copies a paragraph), a shorter answer
    set_number(page, "max_new_tokens", 64)
    for attempt in range(2):
        busy = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 240\nwhile time.time() < end: pass"])
                for _ in range(2)]  # bounded: they end on their own even if the test dies
        try:
            loaded = race(page)
        finally:
            for p in busy:
                p.kill()
        quiet = race(page)
        # The app's fast pass builds in the background: races on two passes are not one race repeated.
        passes = [re.search(r"(compiled|eager) pass", status).group(1) for status in (loaded, quiet)]
        if passes[0] == passes[1]:
            break
    if "No speedup shown" in loaded:  # the race leaves this rare (issue 58 keeps its last cases open): it says why
        assert "load changed" in loaded, loaded
        return
    figure = r"after the prefill (\d+\.\d+)× \(95 % of the step times' spread: (\d+\.\d+)–(\d+\.\d+)×\)"
    low, high = map(float, re.search(figure, loaded).group(2, 3))
    decoding = float(re.search(figure, quiet).group(1))  # the interval is the after-prefill ratio's, not the overall one's
    # Before the race stepped both in turn: 21× loaded against 2.3× quiet. The strict check (a quiet repeat inside the
    # interval) is tests/service/test_race.py's, on the service; here the browser draws on the same 2 cores as the runs and
    # the suite's other worker: within a quarter beyond it.
    assert low / 1.25 <= decoding <= high * 1.25, (loaded, quiet)


def test_browser_the_tour_goes_stop_by_stop_forward_and_back(page):
    """The tour sits under Run: each click replays one mode's recording with its note above the status; next and
    previous move through every mode, in order, and stop at the ends."""
    from app.ui.run_tab import tour_modes, tour_stops

    stops = tour_stops()
    assert [s.split("-")[0] for s in stops] == tour_modes()  # a recording ships for every mode and merged tree
    page.locator("#replay").click()  # the accordion
    page.locator("#replay-paced input").uncheck()  # all at once: the test checks the order, not the pace
    assert page.locator("#tour").is_visible() and page.locator("#tour-next").is_visible()
    note = "n => new RegExp(`^Tour ${n}/`).test(document.querySelector('#tour-note')?.innerText || '')"
    replayed = "n => document.querySelector('#status')?.innerText.includes('Replayed a recording') && " + note[5:]
    page.click("#tour")
    page.wait_for_function(note, arg=1)
    for n in range(2, len(stops) + 1):
        page.wait_for_function(replayed, arg=n - 1, timeout=120_000)  # the stop's replay is done
        page.click("#tour-next")
        page.wait_for_function(note, arg=n, timeout=120_000)
    wait_status(page, "Replayed a recording")
    last = page.inner_text("#tour-note")
    assert "EAGLE + prompt lookup" in last and "the last stop" in last
    assert "EAGLE" in page.inner_text("#learn-mode")  # the last stop's Learn paragraph
    page.click("#tour-next")  # past the end: the last stop again
    page.wait_for_function(replayed, arg=len(stops), timeout=120_000)
    page.click("#tour-back")
    page.wait_for_function(note, arg=len(stops) - 1, timeout=120_000)
    mode = stops[-2].split("-")[0].split("+")[0]
    page.wait_for_function("m => document.querySelector(`#mode input[value=${m}]`)?.checked", arg=mode)
