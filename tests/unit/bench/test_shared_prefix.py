"""Bench replays a trace's prefix-block ids (Mooncake ``hash_ids``): calls that share ids
share a prompt prefix, and the sent trace keeps the ids for ``simulate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from headway.bench.payloads import RequestEncoder, parse_target
from headway.bench.records import OK, CallRecords
from headway.bench.sent_trace import write_sent_trace
from headway.core.workload.compile import compile_workload
from headway.files.workload import load_workload
from headway.server_vocabulary import ServerVocabulary
from headway.trace.readers import read_trace

WORDS = (" the", " and", " for", " you", " not", " are", " but", " can",
         " all", " one", " had", " was", " her", " his", " out", " day")  # fmt: skip
VOCAB = ServerVocabulary(words=WORDS, word_ids=tuple(range(16)), completions_overhead_tokens=1,
                         chat_overhead_tokens=9)  # fmt: skip


def _words(prompt: bytes) -> list[bytes]:
    assert len(prompt) % 4 == 0
    return [prompt[i : i + 4] for i in range(0, len(prompt), 4)]


def test_calls_sharing_ids_share_exactly_those_blocks() -> None:
    """Two calls with the same two leading ids agree on 2 × 16 words and differ right
    after; a third with another first id differs at once; every prompt keeps its size."""
    enc = RequestEncoder(parse_target("http://h:1"), "m", endpoint="completions", vocabulary=VOCAB)
    enc.share_prefixes([0, 1, 2, -1], [(np.array([5, 6, 70]), 16), (np.array([5, 6, 71]), 16),
                                       (np.array([9, 6]), 16)])  # fmt: skip
    a, b, c, d = (_words(enc.prompt(call, 60)) for call in range(4))
    for words in (a, b, c, d):
        assert len(words) == 60 - 1  # the BOS is the server's
    assert a[:32] == b[:32] and a[32] != b[32]
    assert a[:8] != c[:8]  # another id: another block text
    assert d[:8] != a[:8]  # no ids: the unique tag first, as before
    short = _words(enc.prompt(0, 10))  # shorter than its blocks: a cut prefix
    assert short == a[:9]


def test_without_ids_the_prompt_is_unchanged() -> None:
    plain = RequestEncoder(parse_target("http://h:1"), "m", run_tag="00000001", vocabulary=VOCAB)
    shared = RequestEncoder(parse_target("http://h:1"), "m", run_tag="00000001", vocabulary=VOCAB)
    shared.share_prefixes([-1, 0], [(np.array([1]), 16)])
    assert plain.prompt(0, 40) == shared.prompt(0, 40)
    assert plain.prompt(1, 40) != shared.prompt(1, 40)


def test_the_sent_trace_of_a_mooncake_replay_keeps_its_ids(tmp_path: Path) -> None:
    """The sent trace is Mooncake's format with each call's ids; its workload compiles to
    the same ids, counts and times."""
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 250, "input_length": 700, "output_length": 4, "hash_ids": [1, 3]},
        {"timestamp": 500, "input_length": 90, "output_length": 5, "hash_ids": [4]},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "w.yaml").write_text(
        "name: m\nduration_s: 10\nclasses: {c: {calls: 1}}\nsources: [{name: s, arrivals: "
        "{process: trace, path: t.jsonl, format: mooncake}}]\n"
    )
    loaded = load_workload(tmp_path / "w.yaml")
    w = compile_workload(loaded.spec, seed=1, traces=loaded.traces)
    r = CallRecords.empty(w.num_calls)
    r.sent_s[:] = [1.0, 1.25, 1.5]
    r.status[:] = 200
    r.error[:] = OK
    r.prompt_tokens[:] = w.call_input_tokens
    r.completion_tokens[:] = w.call_output_tokens
    trace_path, spec_path = write_sent_trace(tmp_path, w, r)
    sent = read_trace(trace_path)
    assert sent.hash_ids is not None
    assert [ids.tolist() for ids in sent.hash_ids] == [[1, 2], [1, 3], [4]]
    again = load_workload(spec_path)
    w2 = compile_workload(again.spec, seed=1, traces=again.traces)
    assert w2.call_input_tokens.tolist() == [600, 700, 90]
    assert np.allclose(w2.task_arrival_s, [0.0, 0.25, 0.5])
    assert [w2.prefix_hash_ids[i][0].tolist() for i in w2.call_prefix_row] == [
        [1, 2], [1, 3], [4]
    ]  # fmt: skip
