"""The OpenAI-compatible endpoint: request checks, keys, conversation reuse (in process), and the real
`workbench serve llms --http` driven by the `openai` package and curl (integration)."""
import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.endpoint import (MODEL_ID, APIError, APIKeys, ChatEndpoint, Conversation, Conversations,
                                        StopScanner, message_digests, parse_chat_request, parse_http_address)
from workbench.kvcache.protocol import Sampling
from workbench.kvcache.service import LLMService
from workbench.models.decoder import load_decoder
from tests.kvcache.printing import Printing

WORKBENCH = str(Path(sys.executable).with_name("workbench"))
NEW = 6


def body(**fields) -> dict:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], **fields}


# ----------------------------------------------------------------------------- requests, keys, stops

@pytest.mark.parametrize("fields, status, param, said", [
    ({"model": "gpt-4o"}, 404, "model", "does not exist; this service serves 'smollm2-135m-instruct'"),
    ({"model": None}, 400, "model", "must provide a model"),
    ({"messages": []}, 400, "messages", "non-empty array"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "must be one of"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content", "text parts"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, 400, "messages",
     "the last message must be the user's"),
    ({"max_tokens": 0}, 400, "max_tokens", "from 1 to"),
    ({"max_tokens": 1 << 40}, 400, "max_tokens", "from 1 to 1048576"),
    ({"max_tokens": 2.5}, 400, "max_tokens", "an integer"),
    ({"max_tokens": 4, "max_completion_tokens": 4}, 400, "max_tokens", "not both"),
    ({"temperature": 3}, 400, "temperature", "from 0 to 2"),
    ({"temperature": True}, 400, "temperature", "a number"),
    ({"top_p": 0}, 400, "top_p", "above 0"),
    ({"n": 2}, 400, "n", "from 1 to 1"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"stop": [""]}, 400, "stop", "must not be empty"),
    ({"stream": "yes"}, 400, "stream", "true or false"),
    ({"tools": [{"type": "function"}]}, 400, "tools", "does not call tools"),
])
def test_a_bad_request_is_refused_naming_the_field_and_the_allowed_values(fields, status, param, said):
    with pytest.raises(APIError) as caught:
        parse_chat_request(body(**fields), MODEL_ID)
    err = caught.value
    assert (err.status, err.param) == (status, param)
    assert said in err.message
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def test_a_request_is_read_with_openais_defaults_and_names():
    req = parse_chat_request(body(messages=[{"role": "developer", "content": "Be brief."},
                                            {"role": "user", "content": [{"type": "text", "text": "He"},
                                                                         {"type": "text", "text": "llo"}]}],
                                  max_completion_tokens=7, stop="END", seed=-1), MODEL_ID)
    assert req.messages == [("system", "Be brief."), ("user", "Hello")]
    assert req.max_tokens == 7 and req.stop == ("END",) and not req.stream
    assert req.sampling == Sampling(temperature=1.0, top_p=1.0, seed=(1 << 63) - 1)   # OpenAI's default is to sample
    assert parse_chat_request(body(), MODEL_ID).max_tokens is None


@pytest.mark.parametrize("text, host_port", [("127.0.0.1:8000", ("127.0.0.1", 8000)), (":0", ("127.0.0.1", 0)),
                                             ("localhost:80", ("127.0.0.1", 80))])
def test_the_http_address_is_loopback(text, host_port):
    assert parse_http_address(text) == host_port


@pytest.mark.parametrize("text, said", [("0.0.0.0:80", "loopback only"), ("127.0.0.1", "HOST:PORT"),
                                        ("127.0.0.1:70000", "0 to 65535")])
def test_an_http_address_off_loopback_or_malformed_is_refused(text, said):
    with pytest.raises(WorkbenchError, match=said):
        parse_http_address(text)


def test_keys_are_stored_hashed_private_and_seen_by_a_running_reader(tmp_path):
    keys, reader = APIKeys(tmp_path), APIKeys(tmp_path)
    assert reader.app_for("anything") is None
    a = keys.add("notes")
    assert reader.app_for(a) == "key:notes"                       # the reader rereads the changed file
    b = keys.add("mail")
    stored = (tmp_path / "http-keys.json").read_text()
    assert a not in stored and b not in stored
    assert (tmp_path / "http-keys.json").stat().st_mode & 0o777 == 0o600
    assert [reader.app_for(k) for k in (a, b, a[:-1] + "x", "", None)] == ["key:notes", "key:mail", None, None, None]
    with pytest.raises(WorkbenchError, match="already has a key; remove it first"):
        keys.add("notes")
    keys.remove("notes")
    assert reader.app_for(a) is None and keys.names() == ["mail"]
    with pytest.raises(WorkbenchError, match="no key is named 'notes'; the keys are: mail"):
        keys.remove("notes")
    for bad in ("", "-x", "a b", "x" * 65):
        with pytest.raises(WorkbenchError, match="a key's name is 1 to 64"):
            keys.add(bad)


def test_the_longest_recorded_prefix_is_taken_and_held_until_put_back(tmp_path):
    convs = Conversations(tmp_path)
    msgs = [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e")]
    d = message_digests(msgs)
    convs.put("app", Conversation(ctx="short", stub="s1", messages=d[:2]))
    convs.put("app", Conversation(ctx="long", stub="s2", messages=d[:4]))
    convs.put("app", Conversation(ctx="whole", stub="s3", messages=d))     # not a proper prefix: nothing to answer
    assert convs.take("other", d) is None
    taken = convs.take("app", d)
    assert taken.ctx == "long"
    assert convs.take("app", d).ctx == "short"                         # "long" is out while it is served
    assert convs.take("app", message_digests([("user", "a"), ("assistant", "B"), ("user", "c")])) is None
    convs.put("app", taken)
    again = Conversations(tmp_path, live=lambda: {"long"})           # a restart keeps the live contexts' records
    assert again.take("app", d).ctx == "long" and again.count("app") == 0


class _Tok:
    """A tokenizer of one character per id, 0 the end of a turn."""
    im_end_id = 0

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _scan(stops, text, end=False):
    pieces = []
    scanner = StopScanner(_Tok(), stops, pieces.append)
    stopped = False
    for ch in text:
        if scanner.add(ord(ch)):
            stopped = True
            break
    if end and not stopped:
        stopped = scanner.add(0)
    return scanner.finish(), pieces, scanner, stopped


def test_a_stop_sequence_cuts_the_answer_and_no_piece_of_it_is_streamed():
    text, pieces, scanner, stopped = _scan(("END", "!!"), "abcENxENDzz")
    assert (text, stopped, scanner.stopped) == ("abcENx", True, True)
    assert "".join(pieces) == "abcENx" and all("END" not in p for p in pieces)
    text, pieces, scanner, stopped = _scan(("END",), "abc", end=True)
    assert (text, "".join(pieces), scanner.ended, scanner.stopped) == ("abc", "abc", True, False)
    text, pieces, _, _ = _scan(("xyz",), "abcdef")
    assert text == "abcdef" == "".join(pieces)


# ----------------------------------------------------------------------------- conversations on a real service

@pytest.fixture(scope="module")
def model():
    return load_decoder()


@pytest.fixture
def endpoint(model, tmp_path):
    service = LLMService(model, tmp_path / "swap", max_contexts_per_app=3)
    yield ChatEndpoint(service)
    service.close()


def _ask(endpoint, app, messages, **fields):
    req = parse_chat_request({"model": MODEL_ID, "messages": [{"role": r, "content": c} for r, c in messages],
                              "max_tokens": NEW, "temperature": 0, **fields}, MODEL_ID)
    return endpoint.complete(app, req)


def test_a_ten_turn_conversation_continues_one_context_processing_only_each_new_turn(endpoint):
    tok = endpoint.service.tokenizer
    messages = [("system", "Answer in one short sentence.")]
    ctx = None
    for turn in range(10):
        user = f"Give me fact number {turn + 1} about the sea."
        messages.append(("user", user))
        before = 0 if ctx is None else next(c["tokens"] for c in endpoint.service.bind("key:a").contexts())
        done = _ask(endpoint, "key:a", messages)
        assert done.stats["ctx"] == (ctx or done.stats["ctx"])
        ctx = done.stats["ctx"]
        assert done.cached_tokens == before
        if turn:                                      # only the new user turn went through the model
            turn_text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            assert done.stats["prompt_tokens"] in {len(tok.encode(close + turn_text)) for close in ("\n", "<|im_end|>\n")}
        assert done.prompt_tokens == done.cached_tokens + (1 if turn else 0) + done.stats["prompt_tokens"]
        messages.append(("assistant", done.text))
    contexts = endpoint.service.bind("key:a").contexts()
    assert [c["id"] for c in contexts] == [ctx] and contexts[0]["calls"] == 10


def test_an_edited_history_or_another_app_gets_a_new_context(endpoint):
    first = _ask(endpoint, "key:a", [("user", "Name a colour.")])
    history = [("user", "Name a colour."), ("assistant", first.text), ("user", "Another?")]
    mine = _ask(endpoint, "key:a", history)
    assert mine.stats["ctx"] == first.stats["ctx"] and mine.cached_tokens > 0
    theirs = _ask(endpoint, "key:b", history)                        # the same messages from another app
    assert theirs.stats["ctx"] != first.stats["ctx"] and theirs.cached_tokens == 0
    assert [c["id"] for c in endpoint.service.bind("key:b").contexts()] == [theirs.stats["ctx"]]
    edited = _ask(endpoint, "key:a", [("user", "Name a colour."), ("assistant", first.text + " Or blue."),
                                      ("user", "Another?")])
    assert edited.stats["ctx"] != first.stats["ctx"] and edited.cached_tokens == 0
    assert len(endpoint.service.bind("key:a").contexts()) == 2


def test_an_app_at_its_most_contexts_gives_up_its_least_recently_used_conversation(endpoint):
    ctxs = [_ask(endpoint, "key:a", [("user", f"Say {w}.")]).stats["ctx"] for w in ("one", "two", "three", "four")]
    held = {c["id"] for c in endpoint.service.bind("key:a").contexts()}
    assert held == set(ctxs[1:])                                      # three at most: "one" went


def test_a_refused_request_leaves_no_context_and_the_conversation_continues_after(endpoint):
    first = _ask(endpoint, "key:a", [("user", "Hi.")])
    history = [("user", "Hi."), ("assistant", first.text), ("user", "More?")]
    with pytest.raises(WorkbenchError) as caught:
        _ask(endpoint, "key:a", history, max_tokens=9000)
    assert caught.value.room is not None and 8000 < caught.value.room < 8192
    with pytest.raises(WorkbenchError):
        _ask(endpoint, "key:a", [("user", "Fresh.")], max_tokens=9000)
    assert len(endpoint.service.bind("key:a").contexts()) == 1
    assert _ask(endpoint, "key:a", history).stats["ctx"] == first.stats["ctx"]


def test_without_reuse_every_turn_reprocesses_the_conversation_and_keeps_nothing(model, tmp_path):
    service = LLMService(model, tmp_path / "swap")
    try:
        plain = ChatEndpoint(service, reuse=False)
        first = _ask(plain, "key:a", [("user", "Name a colour.")])
        again = _ask(plain, "key:a", [("user", "Name a colour."), ("assistant", first.text), ("user", "Another?")])
        assert again.cached_tokens == 0 and again.stats["prompt_tokens"] == again.prompt_tokens > first.prompt_tokens
        assert service.bind("key:a").contexts() == []
    finally:
        service.close()


def test_a_seeded_sample_repeats_and_temperature_zero_is_the_greedy_answer(endpoint):
    asks = [_ask(endpoint, "key:s", [("user", "Tell me a story.")], temperature=1.0, seed=s).text for s in (5, 5, 6)]
    assert asks[0] == asks[1] != asks[2]
    greedy = _ask(endpoint, "key:g", [("user", "Tell me a story.")], temperature=0).text
    assert greedy == endpoint.service.bind("key:h").call(endpoint.service.bind("key:h").new_ctx(), "Tell me a story.",
                                                         NEW)


# ----------------------------------------------------------------------------- the real server

class Server(Printing):
    """`workbench serve llms --http 127.0.0.1:0` in a subprocess."""

    def __init__(self, swap: Path, address: str):
        super().__init__([WORKBENCH, "serve", "llms", "--swap-dir", str(swap), "--address", address,
                          "--http", "127.0.0.1:0", "--max-contexts-per-app", "4"])
        line = self.wait_for("endpoint on http://", 180)
        self.base = line.split("endpoint on ")[1].split(" ")[0]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def add_key(swap: Path, name: str) -> str:
    out = subprocess.run([WORKBENCH, "serve", "llms", "keys", "add", name, "--swap-dir", str(swap)],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    root = tmp_path_factory.mktemp("http")
    swap = root / "swap"
    keys = {name: add_key(swap, name) for name in ("notes", "mail")}
    server = Server(swap, f"unix:{root / 'sock'}")
    yield server, keys, swap
    server.stop()
    assert server.proc.returncode == 0


def client(http, app):
    import openai

    server, keys, _ = http
    return openai.OpenAI(base_url=server.base, api_key=keys[app], max_retries=0, timeout=120)


@pytest.mark.integration
def test_the_openai_client_lists_the_model_and_holds_a_ten_turn_conversation_streamed_and_not(http):
    c = client(http, "notes")
    assert [m.id for m in c.models.list()] == [MODEL_ID]
    messages = [{"role": "system", "content": "Answer briefly."}]
    ctx = None
    for turn in range(10):
        messages.append({"role": "user", "content": f"Tell me about the number {turn + 1}."})
        if turn % 2:
            pieces, usage, finish = [], None, None
            for chunk in c.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=NEW, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}):
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
                else:
                    usage, llms = chunk.usage, chunk.model_extra["llms"]
            text = "".join(pieces)
            assert len([p for p in pieces if p]) > 1                      # token by token, not one blob
        else:
            reply = c.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=NEW, temperature=0)
            text, usage, finish, llms = (reply.choices[0].message.content, reply.usage, reply.choices[0].finish_reason,
                                         reply.model_extra["llms"])
            assert reply.object == "chat.completion" and reply.model == MODEL_ID
        assert finish in ("stop", "length") and usage.completion_tokens == llms["output_tokens"]
        assert (usage.prompt_tokens_details.cached_tokens > 0) == (turn > 0)
        assert llms["ctx"] == (ctx or llms["ctx"]) and llms["app"] == "key:notes"
        ctx = llms["ctx"]
        messages.append({"role": "assistant", "content": text})


@pytest.mark.integration
def test_two_apps_at_once_keep_their_own_conversations(http):
    results, errors = {}, []
    same = [{"role": "user", "content": "Name three birds."}]

    def talk(app):
        try:
            c = client(http, app)
            first = c.chat.completions.create(model=MODEL_ID, messages=same, max_tokens=NEW, temperature=0)
            follow = same + [{"role": "assistant", "content": first.choices[0].message.content},
                             {"role": "user", "content": "One more?"}]
            second = c.chat.completions.create(model=MODEL_ID, messages=follow, max_tokens=NEW, temperature=0)
            results[app] = (first.model_extra["llms"], second.model_extra["llms"], first.choices[0].message.content)
        except Exception as exc:                     # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=talk, args=(app,)) for app in ("notes", "mail")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    (n1, n2, n_text), (m1, m2, m_text) = results["notes"], results["mail"]
    assert n1["ctx"] == n2["ctx"] != m1["ctx"] == m2["ctx"]              # each continued its own
    assert (n1["app"], m1["app"]) == ("key:notes", "key:mail")
    assert n_text == m_text                                            # the same question, the same greedy answer


def _post(url, data: bytes, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.integration
def test_bad_requests_get_openai_shaped_errors_and_the_service_keeps_serving(http):
    server, keys, swap = http
    url = server.base + "/chat/completions"
    auth = {"Authorization": f"Bearer {keys['notes']}"}
    ok = json.dumps(body(max_tokens=2, temperature=0)).encode()
    cases = [
        (b"{not json", auth, 400, None),
        (json.dumps(body(model="gpt-4o")).encode(), auth, 404, "model_not_found"),
        (json.dumps(body(messages=[{"role": "user", "content": "x" * (2 << 20)}])).encode(), auth, 413,
         "request_too_large"),
        (json.dumps(body(max_tokens=10_000)).encode(), auth, 400, "context_length_exceeded"),
        (ok, {}, 401, "invalid_api_key"),
        (ok, {"Authorization": "Bearer sk-llms-wrong"}, 401, "invalid_api_key"),
    ]
    for data, headers, status, code in cases:
        got, reply = _post(url, data, headers)
        assert got == status, reply
        assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["code"] == code
    got, reply = _post(url, ok, auth)
    assert got == 200 and reply["choices"][0]["message"]["role"] == "assistant"
    late = add_key(swap, "late")                                       # a key added while it runs works at once
    assert _post(url, ok, {"Authorization": f"Bearer {late}"})[0] == 200


@pytest.mark.integration
def test_curl_gets_an_answer_and_a_stream_of_server_sent_events(http):
    server, keys, _ = http
    common = ["curl", "-sS", "--max-time", "120", server.base + "/chat/completions", "-H",
              f"Authorization: Bearer {keys['mail']}", "-H", "Content-Type: application/json"]
    plain = subprocess.run(common + ["-d", json.dumps(body(max_tokens=NEW, temperature=0))], capture_output=True,
                           text=True, check=True)
    reply = json.loads(plain.stdout)
    text = reply["choices"][0]["message"]["content"]
    streamed = subprocess.run(common + ["-N", "-d", json.dumps(body(max_tokens=NEW, temperature=0, stream=True))],
                              capture_output=True, text=True, check=True)
    events = [e for e in streamed.stdout.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == reply["choices"][0]["finish_reason"]
