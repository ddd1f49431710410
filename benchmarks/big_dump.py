"""A ~50 000-API-call step for the compare benchmark: a real dumped step, repeated.

``make_big_pair(d, n_apis)`` dumps one training step of the tiny GPT twice (the "NPU" run with
1e-6 relative weight noise, the same dropout masks), then writes each as a step of about
``n_apis`` API calls (forward and backward keys; stack records, call specs and the manifest as
the writer makes them) by repeating the step's records with call indices renumbered, through
``format/records`` and ``format/manifest``. Full-tensor copies get their own ``.npy`` files
(copied, not hard-linked, so the compare cannot reuse one comparison for many rows);
``save_data=False`` writes statistics only. Reused when already there.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Dict, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
_KEY = re.compile(r"^(?P<fam>[A-Za-z]+_.+)_(?P<k>\d+)_(?P<dir>forward|backward)")


def _template(d: str, noise: float) -> str:
    out = os.path.join(d, "template_npu" if noise else "template_bench")
    if not os.path.isfile(os.path.join(out, "done")):
        import torch   # only to make the template: the compare being measured never imports it

        sys.path.insert(0, ROOT)
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from real_dumps import dump_one_step, perturb

        torch.manual_seed(0)
        prep = (lambda m: [perturb(m, n, rel=noise, seed=i) for i, (n, _) in enumerate(m.named_parameters())]
                and None) if noise else None
        dump_one_step(out, "tiny_gpt", prepare=prep)
        open(os.path.join(out, "done"), "w").close()
    from pytest_ptdbg.format import records

    return records.rank_dir(out)


def _split(name: str) -> Tuple[str, int, str, str]:
    m = _KEY.match(name)
    return m.group("fam"), int(m.group("k")), m.group("dir"), name[m.end():]


def write_big(template_rank: str, out: str, n_apis: int, save_data: bool = True) -> str:
    """Write ``out``'s step0/rank0 from the template rank folder; returns the rank folder."""
    from pytest_ptdbg.format import manifest, records

    rank = records.rank_dir(out)
    pkl = os.path.join(rank, records.pkl_name("api_stack"))
    if os.path.isfile(manifest.manifest_path(pkl)):
        return rank
    src_pkl = os.path.join(template_rank, records.pkl_name("api_stack"))
    src_dir = os.path.join(template_rank, records.data_dir_name("api_stack"))
    lines = [json.loads(x) for x in open(src_pkl, encoding="utf-8")]
    per_copy = sum(1 for r in lines if records.is_stack_record(r))
    n_fam: Dict[Tuple[str, str], int] = {}
    for r in lines:
        fam, k, dr, _ = _split(r[0])
        n_fam[(fam, dr)] = max(n_fam.get((fam, dr), 0), k + 1)
    copies = max(1, round(n_apis / per_copy))
    data_dir = os.path.join(rank, records.data_dir_name("api_stack"))
    os.makedirs(data_dir, exist_ok=True)
    blobs = {}
    if save_data:
        for f in os.listdir(src_dir):
            with open(os.path.join(src_dir, f), "rb") as fh:
                blobs[f] = fh.read()
    n = 0
    with open(pkl, "w", encoding="utf-8") as fo:
        for c in range(copies):
            buf = []
            for r in lines:
                fam, k, dr, rest = _split(r[0])
                key = f"{fam}_{k + c * n_fam[(fam, dr)]}_{dr}"
                rec = list(r)
                rec[0] = key + rest
                if len(rec) > 6 and isinstance(rec[6], dict):
                    ex = dict(rec[6])
                    if "npy" in ex:
                        if save_data:
                            new = rec[0] + ".npy"
                            with open(os.path.join(data_dir, new), "wb") as fh:
                                fh.write(blobs[ex["npy"]])
                            ex["npy"] = new
                        else:
                            del ex["npy"]
                    call = ex.get("call")
                    if isinstance(call, dict) and isinstance(call.get("src"), dict):
                        src = {}   # the dataflow names this copy's producers
                        for slot, (pk, os_) in call["src"].items():
                            pf, pk_k, pd, _ = _split(pk)
                            src[slot] = [f"{pf}_{pk_k + c * n_fam[(pf, pd)]}_{pd}", os_]
                        ex["call"] = dict(call, src=src)
                    rec[6] = ex
                buf.append(records.encode_line(rec))
                n += 1
            fo.write("".join(buf))
    manifest.write_manifest(pkl, n)
    return rank


def make_big_pair(d: str, n_apis: int = 50_000, save_data: bool = True) -> Tuple[str, str]:
    """``(npu_rank_dir, bench_rank_dir)`` of a ~``n_apis``-call pair (full tensors or statistics)."""
    kind = "full" if save_data else "stats"
    tn, tb = _template(d, 1e-6), _template(d, 0.0)
    return (write_big(tn, os.path.join(d, f"big{n_apis}_{kind}_npu"), n_apis, save_data),
            write_big(tb, os.path.join(d, f"big{n_apis}_{kind}_bench"), n_apis, save_data))


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    print(make_big_pair(sys.argv[1], n, save_data=True))
    print(make_big_pair(sys.argv[1], n, save_data=False))
