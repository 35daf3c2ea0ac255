"""Fixtures of the browser tests: the web app as a real server on the bundled model (one per test module), a page of
it in Debian's chromium (the `browser` fixture of tests/conftest.py), and screenshots to the test artifacts (and with
`--update-screenshots` to assets/screenshots/). The page helpers (set_number, inspect_step, wait_status) are in
tests/helpers.py."""

import pytest

from helpers import ARTIFACTS, SHOTS, free_port, running_server


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradio")
    env = {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp),
           "GRADIO_EXAMPLES_CACHE": str(tmp / "examples")}
    # A store of its own (builds and training runs stay out of the working tree's engines/), sharing the
    # dequantized models through a link.
    from app import models

    engines = tmp / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    models.locate(models.BUNDLED)
    port = free_port()
    # Gradio prints "Running on local URL" before it answers: wait for its API info instead.
    with running_server(["--port", str(port), "--max-concurrency", "1", "--engines-dir", str(engines)], "/gradio_api/info",
                        port, tmp / "app.log", env) as url:
        yield url


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    dialogs, errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app_url)
    page.wait_for_selector("#run")
    yield page
    assert not dialogs, f"the page opened dialogs (unescaped script?): {dialogs}"
    assert not errors, f"JavaScript errors: {errors}"
    context.close()


@pytest.fixture
def screenshot(page, request):
    folders = [ARTIFACTS / "screenshots"] + ([SHOTS] if request.config.getoption("--update-screenshots") else [])

    def shoot(name, full_page=True):
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)

    return shoot
