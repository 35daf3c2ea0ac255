"""Who a visitor is, and the share each one gets on a public server: an identity the client cannot choose (its
address, with Gradio's session hash only a sub-bucket of it), every costly thing counted against it, a queue that
serves addresses in turn, no path into the server's files, no one-time work a visitor can start. The servers
themselves, under forged identities, are in tests/service/test_public.py and tests/service/test_http.py."""

import threading

import pytest

from app.modes import ConfigError
from app.modes import notation
from app.modes.errors import one_line
from app.service.api import Service
from app.service.jobs import JobManager, Limits, QueueFull, TooMany
from app.service.policy import Policy, address_of, visitor
from app.ui.sessions import Sessions, visitor_of
from app.ui.uploads import Ledger


def held(gate: threading.Event, started: threading.Semaphore | None = None, ran: list | None = None, name=None):
    def work(cancel):
        if ran is not None:
            ran.append(name)
        if started is not None:
            started.release()
        gate.wait(30)
        yield {"type": "end", "finish_reason": "length", "error": None}

    return work


# ----------------------------------------------------------------------------- the identity


def test_a_visitor_is_its_address_first_whatever_session_hash_it_chooses():
    forged = visitor("127.0.0.1", "x y ../../ 10.0.0.9")
    assert address_of(forged) == "127.0.0.1"
    assert address_of(visitor("::1", "abc")) == "::1" and address_of("10.1.2.3") == "10.1.2.3"
    assert visitor(None, None) is None and address_of(None) is None

    class Request:  # what Gradio hands a handler: the connection's address as the server resolved it, and the hash
        def __init__(self, host, session_hash):
            self.client, self.session_hash = type("C", (), {"host": host})(), session_hash

    a, b = visitor_of(Request("127.0.0.1", "one")), visitor_of(Request("127.0.0.1", "two"))
    assert a != b and address_of(a) == address_of(b) == "127.0.0.1"
    assert visitor_of(None) is None


# ----------------------------------------------------------------------------- the queue


def test_twenty_forged_session_hashes_from_one_address_hold_that_addresses_places_only():
    jobs = JobManager(Limits(max_concurrency=1, max_queue=8))
    gate = threading.Event()
    admitted, refused = [], []
    for i in range(20):
        who = visitor("127.0.0.1", f"forged-{i}")
        try:
            admitted.append(jobs.submit(held(gate), who, 2, address_of(who), 3))
        except TooMany as err:
            refused.append(str(err))
    assert len(admitted) == 3 and len(refused) == 17
    assert all("your address already has 3 generation(s)" in r for r in refused)
    # Another address still gets in: the queue is not full.
    other = jobs.submit(held(gate), visitor("127.0.0.2", "page"), 2, "127.0.0.2", 3)
    gate.set()
    for job in admitted + [other]:
        assert list(job.messages(timeout=30))[-1]["finish_reason"] == "length"
    jobs.shutdown()


def test_a_cancelled_waiting_job_leaves_the_queue_at_once():
    jobs = JobManager(Limits(max_concurrency=1, max_queue=2))
    gate, started = threading.Event(), threading.Semaphore(0)
    running = jobs.submit(held(gate, started))
    assert started.acquire(timeout=30)
    waiting = [jobs.submit(held(gate)) for _ in range(2)]
    with pytest.raises(QueueFull):
        jobs.submit(held(gate))
    for job in waiting:  # clients that dropped their calls: their places go now, not when a worker reaches them
        job.cancel()
    fresh = [jobs.submit(held(gate)) for _ in range(2)]
    mine = visitor("127.0.0.1", "a")
    with pytest.raises(TooMany):  # and per visitor too: two cancelled of one visitor's leave room for two more
        jobs.submit(held(gate), mine, 0)
    gate.set()
    for job in [running, *waiting, *fresh]:
        list(job.messages(timeout=30))
    assert [j.status for j in waiting] == ["cancelled", "cancelled"]
    jobs.shutdown()


def test_a_free_worker_serves_the_address_served_longest_ago_first():
    jobs = JobManager(Limits(max_concurrency=1, max_queue=8))
    gate, started, ran = threading.Event(), threading.Semaphore(0), []
    first = jobs.submit(held(gate, started, ran, "burst-0"), None, None, "127.0.0.1")
    assert started.acquire(timeout=30)
    burst = [jobs.submit(held(gate, None, ran, f"burst-{i}"), None, None, "127.0.0.1") for i in (1, 2, 3)]
    late = jobs.submit(held(gate, None, ran, "other"), None, None, "127.0.0.2")
    gate.set()
    for job in [first, *burst, late]:
        list(job.messages(timeout=30))
    assert ran == ["burst-0", "other", "burst-1", "burst-2", "burst-3"]
    jobs.shutdown()


def test_replays_at_the_recorded_pace_are_bounded_per_address():
    import gradio as gr

    sessions = Sessions(max_replays=4, per_address=1)
    with sessions.replaying(visitor("127.0.0.1", "a")):
        with pytest.raises(gr.Error, match="your address already plays 1 replay"):
            with sessions.replaying(visitor("127.0.0.1", "b")):
                pass
        with sessions.replaying(visitor("127.0.0.2", "c")):  # another address plays
            pass
    with sessions.replaying(visitor("127.0.0.1", "b")):  # the first ended: room again
        pass
    few = Sessions(max_replays=2, per_address=1)  # and the server's own bound, whatever the addresses
    with few.replaying(visitor("127.0.0.1", "a")), few.replaying(visitor("127.0.0.2", "a")):
        with pytest.raises(gr.Error, match="2 replays are playing on this server"):
            with few.replaying(visitor("127.0.0.3", "a")):
                pass


# ----------------------------------------------------------------------------- no path into the server's files


def test_a_tree_is_named_from_the_shipped_presets_only_and_paths_get_one_sentence(tmp_path):
    (tmp_path / "tree.json").write_text("[[0],[0,0]]")
    exists = str(tmp_path / "tree")
    missing = str(tmp_path / "nothing")
    said = []
    for name in (exists, missing, "../../../../../../" + exists.lstrip("/"), "../../engines/models/x/tokenizer"):
        with pytest.raises(ConfigError) as err:
            notation.medusa_choices(name)
        said.append(str(err.value).replace(one_line(name, 60), "NAME"))
    assert len(set(said)) == 1 and said[0].startswith("unknown tree 'NAME': use one of chain, default")
    assert notation.medusa_choices("chain")[:2] == [[0], [0, 0]]
    service = _public(tmp_path)
    try:
        for field in ("medusa_choices", "eagle_choices"):
            mode = "Medusa" if field == "medusa_choices" else "Eagle"
            extra = {} if mode == "Medusa" else {"use_dynamic_tree": False}
            with pytest.raises(ConfigError, match="unknown tree"):
                service.request({"speculative_config": {"decoding_type": mode, field: exists, **extra}})
    finally:
        service.close()


# ----------------------------------------------------------------------------- no one-time work for visitors


def _public(tmp_path):
    return Service(engines=tmp_path / "engines", policy=Policy.for_public())


def test_public_mode_runs_its_operators_dtype_only(tmp_path):
    service = _public(tmp_path)
    try:
        assert service.request({"dtype": "auto"}).dtype == "auto"
        assert service.request({"dtype": "float32"}).dtype == "float32"
        for data in ({"dtype": "bfloat16"}, {"dtype": "bfloat16", "backend": "vllm"}):
            with pytest.raises(ConfigError, match="this public server runs float32 only"):
                service.request(data)
        with pytest.raises(ConfigError, match="this public server runs float32 only"):
            service.pass_cost("Hello there", "bfloat16")
        assert service.dtypes() == ("float32",) and service.fast_dtype() == "float32"
        assert Service(engines=tmp_path / "engines").dtypes() == ("float32", "bfloat16")
        assert not service.backends["transformers"].build_companions  # a visitor's module compiles nothing
    finally:
        service.close()


def test_measure_counts_against_its_visitor_and_is_short_in_public_mode(tmp_path):
    service = Service(engines=tmp_path / "engines", policy=Policy.for_public(), limits=Limits(max_concurrency=1))
    try:
        with pytest.raises(ConfigError, match="this server takes at most 512"):
            service.pass_cost("word " * 600)
        gate = threading.Event()
        who = visitor("127.0.0.1", "page")
        holding = [service.queue(held(gate), who) for _ in range(2)]  # two Measures (or runs) of this visitor
        with pytest.raises(TooMany, match="you already have 2 generation"):
            service.pass_cost("Hello there", visitor=who)
        holding.append(service.queue(held(gate), visitor("127.0.0.1", "forged")))  # a forged hash: the third place
        with pytest.raises(TooMany, match="your address already has 3"):
            service.pass_cost("Hi", visitor=visitor("127.0.0.1", "forged-again"))
        gate.set()
        for job in holding:
            list(job.messages(timeout=30))
    finally:
        service.close()


# ----------------------------------------------------------------------------- uploads


def test_the_upload_ledger_bounds_each_address_and_the_total_and_removes_old_files(tmp_path):
    now = [0.0]
    ledger = Ledger(per_address=20, total=30, window_s=600, clock=lambda: now[0])
    files = []
    for i in range(2):
        entry = ledger.reserve("a", 8)
        f = tmp_path / f"a{i}.json"
        f.write_text("{}")
        ledger.stored(entry, [str(f)])
        files.append(f)
    assert "your address has uploaded" in ledger.reserve("a", 8)  # 16 + 8 > 20
    entry_b = ledger.reserve("b", 8)
    assert isinstance(entry_b, dict)
    assert "recent uploads, the most it keeps" in ledger.reserve("c", 8)  # 24 + 8 > 30
    ledger.release(entry_b)  # a refused upload stored nothing
    assert isinstance(ledger.reserve("c", 8), dict)
    now[0] = 601.0
    ledger.sweep()
    assert not any(f.exists() for f in files)
    assert isinstance(ledger.reserve("a", 16), dict)  # the window passed: the address may upload again
