"""The Run tab for a lecture, in a real browser on the bundled model: a first click that shows speculation
earning, presenter mode stepped from the keyboard, shareable links, and the tour of every mode's recording.
A module of its own (its own app server), so the suite's two workers share the browser tests."""

import re

from test_web import (PROMPT, RECORDINGS, app_url, browser, page, screenshot, set_number,  # noqa: F401  (fixtures)
                      wait_status)


# ----------------------------------------------------------------------------- shareable links


def test_browser_link_sets_up_the_page_and_copy_link_gives_it_back(page, app_url):
    from app.prompts import load_prompts

    summarization = next(r["text"] for r in load_prompts(None, ["summarization"], 1))
    query = "mode=lookahead&example=241&la=5,3,2&dtype=float32"
    page.goto(f"{app_url}/?{query}")
    page.wait_for_function("document.querySelector('#mode input[value=lookahead]')?.checked")
    page.wait_for_function("t => document.querySelector('#prompt textarea').value === t", arg=summarization)
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


def test_browser_bad_link_parameters_get_a_note_not_an_error(page, app_url):
    page.goto(f"{app_url}/?mode=warp&la=99,1&tab=compare&pl_ngram=3")
    page.wait_for_function("/Link: ignored/.test(document.querySelector('#link-note')?.innerText || '')")
    note = page.inner_text("#link-note")
    assert "mode=warp" in note and "la=99,1" in note and "pl_ngram" not in note
    assert page.locator("#cmp-prompt").is_visible()  # tab=compare opened the Compare tab
    assert page.get_by_label("number input for max_matching_ngram_size", exact=True).input_value() == "3"


def test_browser_link_replays_a_recording(page, app_url):
    name = RECORDINGS[0].stem
    page.goto(f"{app_url}/?replay={name}")
    status = wait_status(page, "finished|stopped")
    assert page.locator("#step-view .step").count() >= 2, status


def test_browser_presenter_mode_steps_through_a_run_from_the_keyboard(page, app_url, screenshot):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{app_url}/?present=1&mode=suffix")
    page.wait_for_function("document.body.classList.contains('sd-presenting')")
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline runs just before, under the same load)").set_checked(False)
    page.click("#run")
    wait_status(page, "finished")
    last = int(page.get_by_label("number input for Inspect step", exact=True).input_value())
    assert last >= 3
    heading = "n => document.querySelector('#step-detail h4')?.innerText.startsWith(`Step ${n} `)"
    page.click("#status")  # focus off the inputs: the keys step the run
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(heading, arg=last - 1)
    narration = page.inner_text("#step-detail .sd-narration")
    assert "target" in narration.lower() and len(narration) > 30
    big = page.eval_on_selector("#step-detail .sd-narration", "e => parseFloat(getComputedStyle(e).fontSize)")
    assert big >= 24  # reads from the back of a room
    page.evaluate("document.querySelector('#step-detail').scrollIntoView({block: 'start'})")
    screenshot("presenter", full_page=False)  # what a projector shows at 1280x720
    page.keyboard.press("ArrowRight")
    page.wait_for_function(heading, arg=last)
    set_number(page, "Inspect step", 1)
    page.wait_for_function(heading, arg=1)
    page.fill("#pace input", "0.3")  # the script reads the box as it plays
    page.click("#status")
    page.keyboard.press(" ")  # play: the steps advance on their own
    page.wait_for_function(heading, arg=3, timeout=20_000)
    page.click("#step-play")  # pause
    page.click("#step-back")
    page.wait_for_function("() => /^Step \\d+ /.test(document.querySelector('#step-detail h4')?.innerText || '')")
    page.uncheck("#present input")
    page.wait_for_function("!document.body.classList.contains('sd-presenting')")
    assert not page.locator("#presenter-row").is_visible()


def test_browser_first_run_on_a_fresh_page_shows_speculation_earning(page):
    """The page's defaults as they are: Run, and the status line shows prompt lookup's τ and its speedup in the
    race against the autoregressive run (one run, side by side). The counter-example is one click away."""
    page.click("#run")
    status = wait_status(page, "finished")
    status = wait_status(page, "autoregressive run's tokens/s")  # the race's verdict comes with the end
    tau = float(re.search(r"τ (\d+\.\d+) tokens/pass", status).group(1))
    speedup = float(re.search(r"(\d+\.\d+)× the autoregressive run's tokens/s", status).group(1))
    assert tau >= 1.5 and speedup > 1.2, status
    assert "copies the paragraph" in page.inner_text("#prompt-why")
    page.click("#counter-example")
    page.wait_for_function("/travel blog/i.test(document.querySelector('#prompt textarea').value)")


def test_browser_tour_plays_every_modes_recording(page):
    from app.ui.run_tab import TOUR_MODES, tour_stops

    stops = tour_stops()
    assert [s.split("-")[0] for s in stops] == list(TOUR_MODES)  # a recording ships for every mode and merged tree
    page.locator("#replay").click()  # the accordion
    page.locator("#replay-paced input").uncheck()  # all at once: the test checks the order, not the pace
    page.evaluate("""() => { window.tourSeen = [];
        const note = document.querySelector('#tour-note');
        new MutationObserver(() => { const t = note.innerText; if (t && window.tourSeen.at(-1) !== t) window.tourSeen.push(t); })
            .observe(note, {subtree: true, childList: true, characterData: true}); }""")
    page.click("#tour")
    page.wait_for_function("n => new RegExp(`^Tour ${n}/`).test(document.querySelector('#tour-note')?.innerText || '')",
                           arg=len(stops), timeout=300_000)
    wait_status(page, "Replayed a recording")
    seen = [t for t in page.evaluate("window.tourSeen") if t.startswith("Tour ")]  # not Gradio's own timer
    assert [int(t.split("/")[0].removeprefix("Tour ")) for t in seen] == list(range(1, len(stops) + 1)), seen
    assert "EAGLE + prompt lookup" in seen[-1]
    assert "EAGLE" in page.inner_text("#learn-mode")  # the last stop's Learn paragraph
