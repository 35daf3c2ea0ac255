"""Hostile input: what a visitor who means harm could send, to the configs, to a trace replay and to the real
`python -m app serve` on loopback. Every answer is a worded refusal or a correct result: never a bare error,
never a 500, and the server still answers a normal request afterwards. Property-based fuzzing (hypothesis)
covers what the listed cases do not."""

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.modes import ConfigError
from app.modes import MODES
from app.modes import configs
from app import traces
from app.modes import limits
from app.service.policy import Policy, relative
from app.traces import TraceError
from app.ui import render
from helpers import checked
from helpers import free_port, running_server, serve_engines, soak

# ----------------------------------------------------------------------------- configs: every number bounded


def eagle(**fields):
    return {"speculative_config": {"decoding_type": "Eagle", **fields}}


@pytest.mark.parametrize("data, fragment", [
    ({"sampling": {"seed": 1e30}}, "seed must be a whole number in [0, 2^63 - 1]"),
    ({"sampling": {"seed": 10**400}}, "got 10000000000000000000…"),
    ({"sampling": {"seed": -1}}, "seed must be"),
    ({"sampling": {"temperature": 1e300}}, "temperature must be a number in [0, 100]"),
    ({"sampling": {"top_k": 10**12}}, "top_k must be in [0, 1048576]"),
    ({"max_new_tokens": 10**9}, "max_new_tokens must be in [1, 8192]"),
    ({"max_new_tokens": float("nan")}, "max_new_tokens"),
    (eagle(max_total_draft_tokens=4, dynamic_tree_max_topK=1000, min_path_prob=0), "dynamic_tree_max_topK (eagle_top_k) must be in [1, 16]"),
    (eagle(max_total_draft_tokens=4, dynamic_tree_max_topK=12), "top-k at most 10"),
    (eagle(num_eagle_layers=100), "num_eagle_layers (the tree depth, eagle_depth) must be in [1, 16]"),
    (eagle(max_total_draft_tokens=80), "max_total_draft_tokens at most 63"),
    ({"speculative_config": {"decoding_type": "NGram", "max_candidates": 1000}}, "max_candidates must be in [1, 16]"),
    ({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 64, "max_candidates": 4}}, "verifies at most 96"),
    ({"speculative_config": {"decoding_type": "NGram", "max_matching_ngram_size": 10**6}}, "max_matching_ngram_size must be in [1, 32]"),
    ({"speculative_config": {"decoding_type": "NGram", "ngram_draft_lens": [1] * 100}}, "at most 32"),
    ({"speculative_config": {"decoding_type": "NGram", "ngram_draft_lens": [10**9]}}, "at most 256"),
    ({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 64}}, "at most 32 on the transformers backend"),
    ({"speculative_config": {"decoding_type": "Lookahead", "max_window_size": 10**30, "max_ngram_size": 1,
                             "max_verification_set_size": 0}}, "max_window_size (W) must be in [1, 256]"),
    ({"speculative_config": {"decoding_type": "Lookahead", "max_window_size": 16, "max_ngram_size": 9,
                             "max_verification_set_size": 16}}, "the transformers backend verifies at most 96"),
    ({"speculative_config": {"decoding_type": "Medusa", "num_medusa_heads": 10**6}}, "num_medusa_heads must be in [1, 16]"),
    ({"speculative_config": {"decoding_type": "Medusa", "posterior_alpha": 1e300}}, "posterior_alpha must be in [0, 1]"),
    ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "[" * 100000}}, "a tree is at most 65,536 characters"),
    ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "[" * 20000}}, "a tree must be a JSON list"),
    ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "[[" + "9" * 5000 + "]]"}}, "a tree must be a JSON list"),
    ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": [[0]] * 5000}}, "at most 1024"),
    ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": [[10**6]]}}, "ranks in [0, 1024)"),
])
def test_every_number_has_an_upper_bound_and_a_sentence(data, fragment):
    with pytest.raises(ConfigError) as err:
        checked(data)
    assert fragment in str(err.value) and "\n" not in str(err.value) and len(str(err.value)) < 400


def test_the_widest_allowed_step_is_accepted_and_tensorrt_llm_keeps_its_own_limits():
    widest = checked(eagle(max_total_draft_tokens=limits.STEP_EAGLE_TOKENS, dynamic_tree_max_topK=limits.STEP_EAGLE_TOP_K,
                           num_eagle_layers=limits.STEP_EAGLE_DEPTH, min_path_prob=0))
    assert widest.speculative_config.max_total_draft_tokens == 63
    # The step budget is the transformers backend's: TensorRT-LLM's engines take their own (at most 256 draft tokens).
    trt = checked({**eagle(max_total_draft_tokens=200, speculative_model="x"), "backend": "tensorrt_llm"})
    assert trt.speculative_config.max_total_draft_tokens == 200


NUMBERS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                    st.text(max_size=5), st.booleans())


@given(st.fixed_dictionaries({}, optional={
    "max_new_tokens": NUMBERS, "sampling": st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "seed"]), NUMBERS),
    "speculative_config": st.fixed_dictionaries(
        {"decoding_type": st.sampled_from([m.decoding_type for m in MODES])},
        optional={k: NUMBERS for k in ("max_draft_len", "max_total_draft_tokens", "dynamic_tree_max_topK", "num_eagle_layers", "max_window_size",
                                        "max_ngram_size", "max_verification_set_size", "max_candidates",
                                        "max_matching_ngram_size", "num_medusa_heads", "min_path_prob",
                                        "posterior_alpha")})}))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_request_is_valid_and_bounded_or_refused_in_a_sentence(data):
    try:
        request = checked(data)
    except ConfigError as err:
        assert str(err) and "\n" not in str(err)
        return
    c = request.speculative_config
    assert request.max_new_tokens <= configs.MAX_NEW_TOKENS
    assert configs.draft_tokens(c) <= limits.STEP_DRAFT_TOKENS
    assert request.sampling.seed is None or 0 <= request.sampling.seed < 2**63


# ----------------------------------------------------------------------------- the policy


def test_public_mode_names_models_only_from_the_registry_and_says_the_same_of_any_path(tmp_path):
    policy = Policy.for_public()
    (tmp_path / "exists").mkdir()
    said = []
    for name in (str(tmp_path / "exists"), str(tmp_path / "missing"), "../../etc", "HuggingFaceTB/SmolLM2-360M"):
        with pytest.raises(ConfigError) as err:
            policy.check_model_name(name, ("smollm2-135m-instruct-draft",))
        said.append(str(err.value).replace(name[:80], "NAME"))
    assert len(set(said)) == 1 and "registry model (smollm2-135m-instruct-draft)" in said[0]
    Policy.for_public(allow_model_paths=True).check_model_name(str(tmp_path / "exists"), ())
    Policy.for_public(allow_hub=True).check_model_name("HuggingFaceTB/SmolLM2-360M", ())
    Policy().check_model_name(str(tmp_path / "missing"), ())  # off public mode: the operator's own machine


def test_responses_show_paths_relative_to_the_servers_folders():
    roots = {"/srv/app/engines": "engines", "/srv/app": "", "/home/op": "~"}
    data = {"model_dir": "/srv/app/engines/models/x", "log": ["see /srv/app/scripts/a.sh and /home/op/.cache"]}
    assert relative(data, roots) == {"model_dir": "engines/models/x", "log": ["see scripts/a.sh and ~/.cache"]}


# ----------------------------------------------------------------------------- traces


def prefill(**extra):
    return {"kind": "prefill", "tokens": [1], "totals": {"new_tokens": 1, "elapsed_s": 0.1}, **extra}


def decode(**extra):
    return {"kind": "decode", "tokens": [2], "proposed": {"tokens": [2], "parents": [-1]}, "accepted": [0],
            "totals": {"new_tokens": 2, "elapsed_s": 0.2}, **extra}


def trace(*steps, **fields):
    return {"mode": "prompt_lookup", "steps": list(steps), "texts": {"1": "a", "2": "b"}, **fields}


def test_the_349x_blow_up_is_refused_before_anything_is_drawn():
    # The trace: one 2000-character token text referenced by 20,000 tokens (0.12 MB -> 43 MB of HTML).
    blow_up = trace(prefill(), {**decode(), "tokens": [7] * 1000}, texts={"7": "x" * 2000})
    with pytest.raises(TraceError, match="a token's text has at most 128"):
        traces.parse(blow_up)
    # Within the text cap, the drawn size is what bounds it.
    many = trace(prefill(), *[{**decode(), "tokens": [7] * 1000} for _ in range(20)], texts={"7": "&" * 128})
    with pytest.raises(TraceError, match="MB of HTML; a replay draws at most 2 MB"):
        traces.parse(many)
    run, _ = traces.parse(trace(prefill(), *[{**decode(), "tokens": [7] * 20} for _ in range(20)], texts={"7": "&" * 128}))
    assert len(render.step_view(run.events, run.texts)) <= traces.MAX_HTML


@pytest.mark.parametrize("source, fragment", [
    ({"match": 1}, "source.match must be an object"),
    ({"window": 5}, "source.window must be a list"),
    ({"window": [[1, "x"]]}, "source.window[0][1] must be a token id"),
    ({"candidates": [[-1]]}, "source.candidates[0][0] must be a token id"),
    ({"tree": {"scores": ["x"]}}, "source.tree.scores[0] must be a number or null"),
    ({"prompt_lookup": {"match": {"ngram": 3}}}, "source.prompt_lookup.match.ngram must be a list"),
    ({"draft_probs": [1e300]}, "source.draft_probs[0] must be a number or null"),
    ({"not_visible": ["x" * 1000]}, "source.not_visible[0] must be a short text"),
])
def test_a_source_of_the_wrong_shape_is_refused_naming_the_field(source, fragment):
    # A step's provenance is checked against its mode's shapes (and the common ones): the trace names the mode that
    # records the key.
    key = next(iter(source))
    mode = next((m.name + ("+prompt_lookup" if key == "prompt_lookup" else "") for m in MODES if key in m.provenance),
                "prompt_lookup")
    with pytest.raises(TraceError) as err:
        traces.parse(trace(prefill(), decode(source=source), mode=mode))
    assert fragment in str(err.value) and str(err.value).startswith("step 1 of the trace is malformed")


def test_nesting_numbers_and_reasons_a_trace_may_not_abuse(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"steps": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(TraceError, match="nests too deep"):
        traces.read(deep)
    nested = trace(prefill(), decode(source={"extra": json.loads("[" * 50 + "]" * 50)}))
    with pytest.raises(TraceError, match="levels deep"):
        traces.parse(nested)
    # A total of 1e308 is no number a person reads (dropped); a run without a finish reason says none.
    run, _ = traces.parse(trace(prefill(), decode(totals={"new_tokens": 1e308, "elapsed_s": 0.2})))
    assert "new_tokens" not in run.events[-1]["totals"] and run.end["finish_reason"] is None
    assert "1" * 30 not in render.totals_line(run.events[-1])


@st.composite
def mangled_traces(draw):
    """A valid trace with some field of some step replaced by anything JSON can hold."""
    data = trace(prefill(), decode(source={"match": {"ngram": [1], "position": 0}}), decode())
    json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=8),
                               lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
                               max_leaves=12)
    step = draw(st.integers(0, 2))
    key = draw(st.sampled_from(["tokens", "proposed", "accepted", "rejected", "source", "target", "totals", "kind",
                                "added_token", "accepted_tokens", "added_kind", "finish_reason", "text", "step"]))
    data["steps"][step][key] = draw(json_values)
    if draw(st.booleans()):
        data["steps"][1]["source"] = {draw(st.sampled_from(list({**traces.COMMON_SOURCE, **MODES.provenance()}))): draw(json_values)}
    return data


@given(mangled_traces())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_mangled_trace_is_refused_in_words_or_draws(data):
    try:
        run, _ = traces.parse(data)
    except TraceError as err:
        assert str(err) and "\n" not in str(err)
        return
    for i, event in enumerate(run.events):  # whatever passed draws: the step view and every step's detail
        render.step_view(run.events[: i + 1], run.texts)
        render.step_detail(event, run.texts, run.prompt_ids, run.token_ids)


# ----------------------------------------------------------------------------- the real HTTP server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    engines = serve_engines(tmp)
    port = free_port()
    with running_server(["serve", "--port", str(port), "--public", "--max-new-tokens", "4", "--engines-dir", str(engines)],
                        "/v1/models", port, tmp / "serve.log") as url:
        yield url


def call(url, path, body=None, method="POST", raw: bytes | None = None):
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, text.decode(errors="replace")


def assert_refused(status, body, fragment=""):
    """A 4xx with OpenAI's error body: a message in words and a type."""
    assert 400 <= status < 500, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    message = body["error"]["message"]
    assert isinstance(message, str) and len(message.split()) >= 3 and body["error"]["type"] == "invalid_request_error"
    assert fragment in message, message
    assert "/work/" not in message and "/tmp/" not in message and "/home/" not in message
    assert "\n" not in message, message  # one line: what the client sent is quoted escaped


def completion(prompt="Say hi.", **fields):
    return {"prompt": prompt, "max_tokens": 4, **fields}


@pytest.mark.bundled
@pytest.mark.parametrize("body, fragment", [
    (completion(temperature=1, seed=1e30), "seed must be a whole number"),
    (completion("Echo \ud800 x"), "lone surrogate"),
    (completion(specdec={"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 4, "dynamic_tree_max_topK": 1000,
                                                "min_path_prob": 0}}), "dynamic_tree_max_topK"),
    (completion(specdec={"speculative_config": {"decoding_type": "Draft_Target", "speculative_model": "/etc"}}), "not allowed here"),
    (completion(specdec={"speculative_config": {"decoding_type": "Medusa", "speculative_model": "HuggingFaceTB/x"}}), "not allowed here"),
    (completion(specdec={"speculative_config": {"decoding_type": "Eagle", "speculative_model": "trained:0123456789abcdef"}}),
     "no finished training run"),
    (completion(specdec={"speculative_config": "Eagle"}), "speculative_config"),
    (completion(specdec={"sampling": "hot"}), "specdec.sampling must be an object"),
    (completion(stream="yes"), "stream must be true or false"),
    (completion(n=[2]), "n must be an integer"),
    (completion(n=2), "one choice per request"),
    (completion(max_tokens=float("nan")), "max_new_tokens"),
    (completion(max_tokens=10**30), "max_new_tokens"),
    (completion("x" * 200_000), "characters; this server takes at most"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be text"),
    (completion(user={"a": 1}), "user must be a string"),  # vLLM 0.32 answers 400 too (tests/backends/on_vllm/test_vllm.py)
    # A tree names a shipped preset, never a path: one sentence whether such a file exists or not.
    (completion(specdec={"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "../../../../../../etc/os-release"}}),
     "unknown tree '../../../../../../etc/os-release': use one of"),
    (completion(specdec={"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "../../../../../../etc/nothing"}}),
     "unknown tree '../../../../../../etc/nothing': use one of"),
    (completion(specdec={"speculative_config": {"decoding_type": "Eagle", "use_dynamic_tree": False, "max_draft_len": 6,
                                                "eagle_choices": "../../engines/models/x/tokenizer"}}), "unknown tree"),
    # No visitor starts one-time work: a second dtype would load the model again and build its fast pass.
    (completion(specdec={"dtype": "bfloat16"}), "this public server runs float32 only"),
])
def test_http_refuses_each_bad_request_with_400_and_the_reason(server, body, fragment):
    chat = "messages" in body
    assert_refused(*call(server, "/v1/chat/completions" if chat else "/v1/completions", body), fragment)


@pytest.mark.bundled
def test_http_answers_unknown_paths_methods_and_broken_bodies_in_openai_shape(server):
    assert_refused(*call(server, "/v1/nothing", {}), "there is no /v1/nothing here")
    assert_refused(*call(server, "/", None, method="GET"), "there is no / here")
    assert_refused(*call(server, "/v1/completions", None, method="GET"), "GET is not allowed on /v1/completions")
    assert_refused(*call(server, "/v1/models", {}, method="DELETE"), "not allowed")
    assert_refused(*call(server, "/v1/completions", raw=b"[" * 200_000 + b"]" * 200_000), "not JSON")
    assert_refused(*call(server, "/v1/completions", raw=b"\xff\xfe not utf-8"), "not JSON")
    assert_refused(*call(server, "/v1/completions", raw=b'{"prompt": ' + b"9" * 10_000 + b"}"), "not JSON")
    assert_refused(*call(server, "/v1/completions", raw=b"[1, 2]"), "must be a JSON object")
    assert_refused(*call(server, "/openapi.json", None, method="GET"), "there is no")


JSON_ANY = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
                        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                        max_leaves=8)
FIELD_VALUES = st.one_of(NUMBERS, JSON_ANY)
BODIES = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=30), st.just("Say hi."), JSON_ANY)},
    optional={"max_tokens": st.one_of(st.integers(1, 4), FIELD_VALUES), "temperature": FIELD_VALUES, "top_p": FIELD_VALUES,
              "top_k": FIELD_VALUES, "seed": FIELD_VALUES, "n": FIELD_VALUES, "stream": st.one_of(st.just(False), FIELD_VALUES),
              "model": st.one_of(st.just("smollm2-135m-instruct"), FIELD_VALUES),
              "specdec": st.one_of(JSON_ANY, st.fixed_dictionaries({"speculative_config": st.fixed_dictionaries(
                  {"decoding_type": st.sampled_from([m.decoding_type for m in MODES])},
                  optional={k: FIELD_VALUES for k in ("max_draft_len", "max_total_draft_tokens", "dynamic_tree_max_topK", "num_eagle_layers",
                                                       "speculative_model", "max_window_size", "max_candidates")})}))})


@pytest.mark.bundled
@given(body=BODIES, chat=st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_http_fuzz_never_answers_500(server, body, chat):
    if chat:
        body = {**{k: v for k, v in body.items() if k != "prompt"}, "messages": [{"role": "user", "content": body["prompt"]}]}
    if body.get("stream") is True:
        body["stream"] = False  # a stream's 200 says nothing about its body; the listed cases cover streaming
    status, answer = call(server, "/v1/chat/completions" if chat else "/v1/completions", body)
    if status == 200:
        choice = answer["choices"][0]
        assert choice["finish_reason"] in ("stop", "length") and answer["usage"]["completion_tokens"] >= 1
    elif status == 404:
        assert answer["error"]["code"] == "model_not_found"
    else:
        assert_refused(status, answer)


@pytest.mark.bundled
def test_http_still_serves_a_normal_request_after_all_that(server):
    status, answer = call(server, "/v1/completions", completion("Count: one, two, three,", max_tokens=4))
    assert status == 200 and answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 4
    status, answer = call(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                                                          "specdec": {"speculative_config": {"decoding_type": "Eagle"}}})
    assert status == 200 and answer["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("name", ["a\x00b", "x" * 300, "~nobody-at-all/x", "y/" * 600])
def test_a_model_name_the_file_system_cannot_take_is_refused_in_words_in_any_mode(name):
    for policy in (Policy(), Policy.for_public()):
        with pytest.raises(ConfigError):
            policy.check_model_name(name, ())


def post_from(url, path, body, source="127.0.0.1", headers=None, raw: bytes | None = None):
    """POST from the loopback address `source` (another address is another client) with any `headers`: (status, JSON)."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120, source_address=(source, 0))
    try:
        data = raw if raw is not None else json.dumps(body, allow_nan=True).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
        answer = conn.getresponse()
        text = answer.read()
        try:
            return answer.status, json.loads(text)
        except ValueError:
            return answer.status, text.decode(errors="replace")
    finally:
        conn.close()


@pytest.mark.bundled
def test_http_soak_of_forged_identities_leaves_another_client_served_and_nothing_behind(server):
    """200 hostile and normal requests from one address under 20 forged X-Forwarded-For identities, four at a time,
    while another client (another loopback address) asks for a short completion every few seconds: each of its
    answers comes within 10 s (or, on a machine so busy that one completion alone takes longer than 2.5 s, within four
    of those: a wait for the one job ahead of it and its own, never a queue of the flood's), the forged identities
    share one address's bound, the server's memory levels off, and afterwards nothing runs."""
    import time

    import psutil

    port = int(server.rsplit(":", 1)[1])
    pid = next(c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN")
    proc = psutil.Process(pid)
    hostile = [completion(max_tokens=float("nan")), completion(user={"a": 1}), completion(specdec={"dtype": "bfloat16"}),
               completion(specdec={"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "../../../etc/x"}}),
               completion(specdec={"speculative_config": {"decoding_type": "Draft_Target", "speculative_model": "/etc"}}),
               completion("x" * 200_000), completion(), completion(stream=True), completion("Count to three.")]
    waits = []
    start = time.monotonic()
    assert post_from(server, "/v1/completions", completion(), source="127.0.0.2")[0] == 200
    alone = time.monotonic() - start  # this machine's pace now: the bound below scales with it

    def other_client():
        start = time.monotonic()
        status, body = post_from(server, "/v1/completions", completion(), source="127.0.0.2")
        waits.append((round(time.monotonic() - start, 1), status, body if status != 200 else ""))

    answers, samples = soak(lambda i: post_from(server, "/v1/completions", hostile[i % len(hostile)],
                                                headers={"X-Forwarded-For": f"203.0.113.{i % 20}"}),
                            other_client, lambda: proc.memory_info().rss / 2**20)
    print(f"serve --public: the other client's answers (s): {[w[0] for w in waits]}; RSS {[round(x) for x in samples]}")
    assert all(status in (200, 400, 429) for status, _ in answers), sorted({s for s, _ in answers})
    assert all((isinstance(body, dict) and ("error" in body) == (status != 200))
               or (status == 200 and body.endswith("data: [DONE]\n\n")) for status, body in answers)  # a stream
    busy = [b["error"]["message"] for s, b in answers if s == 429]
    assert all("already ha" in m or "busy" in m for m in busy), busy[:3]
    assert len(waits) >= 2 and all(w[1] == 200 and w[0] <= max(10.0, 4 * alone) for w in waits), (waits, alone)
    assert samples[-1] - samples[2] <= 64, samples
    deadline = time.monotonic() + 30
    while proc.cpu_percent(1.0) > 20 and time.monotonic() < deadline:
        pass
    assert proc.cpu_percent(1.0) <= 20  # nothing left running
