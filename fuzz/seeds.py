#!/usr/bin/env python3
"""Writes the committed seed corpora in fuzz/seeds/ from the capture fixtures.

From the client frames of fixtures/captures/*.jsonl (real OpenClaw clients):

- seeds/frame/          request frames as sent, and a few broken ones;
- seeds/connect/        the params of each distinct `connect`;
- seeds/method_params/  `<method>[ <profile>]\\n<params>` for each method
                        call (at most a few per method), and `{}` for each
                        served method no capture calls;
- seeds/store_request/  session-store requests built from the captures'
                        sessions and messages (written by the ignored test
                        `write_store_seeds` of session-store/tests/fuzz_corpus.rs);
- dicts/method_params.dict  every served method and declared key (written
                        by the ignored test `write_method_dictionary` of
                        gateway-edge/tests/fuzz_corpus.rs).

The two ignored tests run through cargo unless --no-cargo.

Run from anywhere: `python3 fuzz/seeds.py`. It replaces what it wrote
before in those folders; the regression inputs (`regress-*`) stay.
"""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"
CAPTURES = sorted((ROOT / "fixtures" / "captures").glob("*.jsonl"))
PER_METHOD = 3
MAX_FRAMES = 48
MAX_BYTES = 16 * 1024


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def served_methods():
    table = (ROOT / "gateway-edge" / "src" / "methods" / "mod.rs").read_text()
    body = table[table.index("method_table! {") :]
    return re.findall(r'^\s+"([A-Za-z0-9._-]+)"(?: \(hidden\))?, ', body, re.M)


def client_requests():
    """(capture stem, frame) for each client request, in recorded order."""
    for path in CAPTURES:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            frame = record.get("json")
            if record.get("kind") == "frame" and record.get("dir") == "c2s" and isinstance(frame, dict):
                if frame.get("type") == "req":
                    yield path.stem.split("-")[0], frame


def write(folder, name, text):
    data = text.encode()
    if len(data) > MAX_BYTES:
        return False
    digest = hashlib.sha1(data).hexdigest()[:8]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    (folder / f"{safe}-{digest}").write_bytes(data)
    return True


def main():
    folders = {name: SEEDS / name for name in ["frame", "connect", "method_params"]}
    for folder in folders.values():
        # Regression inputs (`regress-*`, added by hand for a fixed crash) stay.
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if not old.name.startswith("regress-"):
                old.unlink()
    served = served_methods()
    requests = list(client_requests())

    # Request frames: one per method first, then others, up to MAX_FRAMES.
    seen, frames = set(), []
    for capture, frame in requests:
        key = frame["method"]
        if key not in seen:
            seen.add(key)
            frames.append((capture, frame))
    for capture, frame in requests:
        if len(frames) >= MAX_FRAMES:
            break
        if (capture, frame) not in frames and len({compact(f) for _, f in frames} | {compact(frame)}) > len(frames):
            frames.append((capture, frame))
    for capture, frame in frames[:MAX_FRAMES]:
        write(folders["frame"], f"{capture}-{frame['method']}", compact(frame))
    broken = {
        "not-json": "{\"type\":\"req\",",
        "not-object": "[1,2]",
        "extra-key": '{"type":"req","id":"1","method":"health","extra":1}',
        "empty-id": '{"type":"req","id":"","method":"health"}',
        "number-id": '{"type":"req","id":7,"method":"health"}',
        "event": '{"type":"event","id":"1","method":"health"}',
        "long-traceparent": compact({"type": "req", "id": "1", "method": "health", "traceparent": "0" * 129}),
        "params-null": '{"type":"req","id":"1","method":"sessions.delete","params":{"archivedOnly":true}}',
        "unserved": '{"type":"req","id":"1","method":"config.set","params":null}',
    }
    for name, text in broken.items():
        write(folders["frame"], f"x-{name}", text)

    # connect params.
    connects = {}
    for capture, frame in requests:
        if frame["method"] == "connect":
            connects.setdefault(compact(frame.get("params", {})), capture)
    for text, capture in connects.items():
        write(folders["connect"], f"{capture}-connect", text)
    base = json.loads(next(iter(connects)))
    variants = {
        "probe": {**base, "minProtocol": 3, "maxProtocol": 4, "client": {**base["client"], "mode": "probe", "id": "openclaw-probe"}},
        "node": {**base, "role": "node", "minProtocol": 3, "maxProtocol": 3, "client": {**base["client"], "mode": "node", "id": "node-host"}},
        "protocol-5": {**base, "minProtocol": 5, "maxProtocol": 6},
        "catalog": {**base, "modelCatalog": {"agentId": "main", "shortId": "abcdef12"}, "permissions": {"a": True}},
    }
    for name, params in variants.items():
        write(folders["connect"], f"x-{name}", compact(params))

    # Method params: a few distinct ones per method, then {} for the rest.
    per_method = {}
    for capture, frame in requests:
        method = frame["method"]
        if method == "connect":
            continue
        params = compact(frame.get("params", {}))
        calls = per_method.setdefault(method, [])
        if params not in calls and len(calls) < PER_METHOD:
            calls.append(params)
    for method, calls in per_method.items():
        for params in calls:
            write(folders["method_params"], method, f"{method}\n{params}")
    for method in served:
        if method not in per_method:
            write(folders["method_params"], method, f"{method}\n{{}}")
    extra = [
        ("runs.resume", None, {"runId": "run-1", "fromSeq": 3, "epoch": "e1"}),
        ("chat.send", "ui", {"sessionKey": "main", "message": "hi", "idempotencyKey": "k1", "__controlUiReconnectResume": True}),
        ("chat.send", "write", {"sessionKey": "main", "message": "/new hello", "idempotencyKey": "k2"}),
        ("chat.send", None, {"sessionKey": "main", "message": "/queue collect", "idempotencyKey": "k3", "timeoutMs": 1000}),
        ("chat.history", "read", {"sessionKey": "main", "messageId": "00000000-0000-0000-0000-000000000000:4", "limit": 10}),
        ("chat.startup", None, {"shortId": "0123abcd", "agentId": "main", "limit": 5}),
        ("sessions.delete", "write", {"key": "agent:main:old", "archivedOnly": True}),
        ("sessions.list", "none", {"limit": 5}),
        ("agent", None, {"message": "hi", "idempotencyKey": "k4", "attachments": [{"mimeType": "text/plain", "content": "aGk="}], "timeout": 60}),
        ("users.prefs.set", None, {"entries": {"theme": "dark"}, "expectedEntries": {"theme": None}}),
    ]
    for method, profile, params in extra:
        head = f"{method} {profile}" if profile else method
        write(folders["method_params"], f"x-{method}-{profile or 'admin'}", f"{head}\n{compact(params)}")

    for name, folder in folders.items():
        print(f"{name}: {len(list(folder.iterdir()))} seeds")
    if "--no-cargo" not in sys.argv:
        for package, test in [("session-store", "write_store_seeds"), ("gateway-edge", "write_method_dictionary")]:
            subprocess.run(
                ["cargo", "test", "-q", "-p", package, "--test", "fuzz_corpus", "--",
                 "--ignored", "--exact", test],
                cwd=ROOT, check=True,
            )
        print(f"store_request: {len(list((SEEDS / 'store_request').iterdir()))} seeds")


if __name__ == "__main__":
    main()
