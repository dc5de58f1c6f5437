"""Fixed prompts (token-id lists) for the real-serving suite, deterministic from a seed.

Token ids are drawn from 4..VOCAB-1 (0..3 are <unk> <s> </s> <pad> in
serving/model.py's vocabulary). Kinds:

  short   1..32 tokens (one chunk)
  medium  40..200 tokens (one to four 64-token chunks)
  long    300..1000 tokens (5..16 chunks of --chunked-prefill-size 64; a long
          prompt plus 64 new tokens stays well under the 2048 context and the
          4096-token pool)
  prefix  groups sharing a prefix (16, 64, 130 and 400 tokens) with distinct
          suffixes (1, 5, 20, 70 tokens): after the first of a group, the
          prefill's radix cache hits
  repeat  exact repeats of earlier prompts (a full-prompt radix hit)

`prompts(n)` takes the first n in a stratified order (round robin over the
kinds, each kind in its own order), so a prefix group's members keep their
order and every kind is present for n >= 5.
"""

import random

SEED = 5023
VOCAB = 256
FIRST_ID = 4

SHORT_LENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 23, 26, 29, 31, 32]
MEDIUM_LENS = [40, 63, 64, 65, 90, 127, 128, 129, 160, 200]
LONG_LENS = [300, 383, 384, 450, 520, 640, 777, 1000]
PREFIX_GROUPS = [(16, [1, 5, 20, 70]), (64, [1, 5, 20, 70]), (130, [1, 5, 20, 70]), (400, [1, 5, 20, 70])]


def _ids(rng, n):
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(n)]


def all_prompts(seed=SEED):
    """Every prompt: dicts {name, kind, group, ids}, in per-kind order."""
    rng = random.Random(seed)
    kinds = {"short": [], "medium": [], "long": [], "prefix": [], "repeat": []}
    for i, n in enumerate(SHORT_LENS):
        kinds["short"].append({"name": f"short{i:02d}-{n}", "kind": "short", "group": None, "ids": _ids(rng, n)})
    for i, n in enumerate(MEDIUM_LENS):
        kinds["medium"].append({"name": f"medium{i:02d}-{n}", "kind": "medium", "group": None, "ids": _ids(rng, n)})
    for i, n in enumerate(LONG_LENS):
        kinds["long"].append({"name": f"long{i:02d}-{n}", "kind": "long", "group": None, "ids": _ids(rng, n)})
    for g, (plen, suffixes) in enumerate(PREFIX_GROUPS):
        prefix = _ids(rng, plen)
        for j, s in enumerate(suffixes):
            kinds["prefix"].append({
                "name": f"prefix{g}-{plen}+{s}", "kind": "prefix", "group": f"prefix{g}",
                "ids": prefix + _ids(rng, s),
            })
    for src in (kinds["medium"][4], kinds["prefix"][5]):
        kinds["repeat"].append({"name": f"repeat-{src['name']}", "kind": "repeat", "group": src["name"], "ids": list(src["ids"])})
    return kinds


def prompts(n=None, seed=SEED):
    """The first n prompts (all when n is None) in stratified order."""
    kinds = all_prompts(seed)
    order = ["short", "prefix", "medium", "long", "short", "prefix", "repeat"]
    queues = {k: list(v) for k, v in kinds.items()}
    out = []
    total = sum(len(v) for v in queues.values())
    while len(out) < total:
        for k in order:
            if queues[k]:
                out.append(queues[k].pop(0))
    # a repeat must come after its source
    names = [p["name"] for p in out]
    for i, p in enumerate(list(out)):
        if p["kind"] == "repeat":
            src = names.index(p["group"])
            if src > i:
                out.remove(p)
                out.insert(src + 1, p)
                names = [q["name"] for q in out]
    return out if n is None else out[:n]


def count():
    return sum(len(v) for v in all_prompts().values())


if __name__ == "__main__":
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else None
    ps = prompts(n)
    for p in ps:
        print(f"{p['name']:24s} {p['kind']:7s} {len(p['ids']):5d}  {p['ids'][:8]}...")
    print(f"{len(ps)} prompts of {count()}; {sum(len(p['ids']) for p in ps)} tokens")
