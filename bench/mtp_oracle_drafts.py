#!/usr/bin/env python3
"""MTP draft tokens: pn against llama.cpp's llama-speculative-simple (--spec-type draft-mtp),
greedy, on the default model and the six prompts of bench/mtp-prompts.txt.

Both run rounds: the pending token plus N drafts verified, `acc` drafts kept and one
token of the model's own. Round r's draft j predicts generated token G_r + j, with
G_{r+1} = G_r + acc_r + 1 (G_0 = 1 for pn, whose first pending token is generated token
0; G_0 = 0 for llama.cpp, whose first pending token is the prompt's last). A draft is compared where both engines drafted
for the same token index and their greedy texts agree up to it (same context).

Usage: bench/mtp_oracle_drafts.py [--pn target/release/pn] [--llama BIN] [--model M]
       [--n 1] [--gen 128] [--kv-type f16] [--json OUT] [--fixture tests/fixtures/mtp-llama-drafts.json]
"""
import argparse, json, os, re, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def pn_rounds(pn, model, prompt, n, gen, kv):
    cmd = [pn, "run", "--draft", "mtp", "--draft-n", str(n), "--draft-policy", "always", "--greedy", "-n", str(gen), "-t", "2", "--kv-type", kv, "-p", prompt]
    if model:
        cmd += ["--model", model]
    err = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PN_DEBUG": "1"}).stderr
    rounds = []
    for m in re.finditer(r"spec round: drafted \[([0-9, ]*)\], accepted (\d+), next (\d+)", err):
        drafts = [int(x) for x in m.group(1).split(",") if x.strip()]
        rounds.append((drafts, int(m.group(2)), int(m.group(3))))
    return rounds


def llama_rounds(llama, model, prompt, n, gen):
    cmd = [llama, "-m", model, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n), "--temp", "0", "-n", str(gen), "-t", "2", "-p", prompt, "-lv", "5"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    rounds, cur = [], []
    for line in text.splitlines():
        m = re.search(r"draft candidate +0, pos +(\d+): +(\d+)", line)
        if m:
            cur.append(int(m.group(2)))
        m = re.search(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)", line)
        if m:
            rounds.append((cur, int(m.group(1)), int(m.group(3))))
            cur = []
    return rounds


def stream(rounds, g):
    """(index -> token) of the generated text, (index -> draft) per draft; `g`: the index
    round 0's first draft predicts."""
    toks, drafts = {}, {}
    for ds, acc, nxt in rounds:
        for j, d in enumerate(ds):
            drafts[g + j] = d
        for j in range(acc):
            toks[g + j] = ds[j]
        toks[g + acc] = nxt
        g += acc + 1
    return toks, drafts


def compare(pr, lr):
    """(tokens the texts agree for, drafts at the same index there, with the same token)."""
    (pt, pd), (lt, ld) = stream(pr, 1), stream(lr, 0)
    same = 1
    while same in pt and same in lt and pt[same] == lt[same]:
        same += 1
    both = [i for i in pd if i in ld and i < same]
    return same - 1, len(both), sum(pd[i] == ld[i] for i in both)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pn", default=os.path.join(HERE, "..", "target", "release", "pn"))
    ap.add_argument("--llama", default=os.path.expanduser("~/.cache/pn-oracle/llama/bin/llama-speculative-simple"))
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "default", "pn-default-code-q4_k_m.gguf"))
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--kv-type", default="f16", help="pn's KV type (llama.cpp's default is f16)")
    ap.add_argument("--json", help="write the per-prompt rounds of both engines here")
    ap.add_argument("--fixture", help="write llama.cpp's rounds here (tests/fixtures/mtp-llama-drafts.json)")
    a = ap.parse_args()
    prompts = [l.rstrip("\n") for l in open(os.path.join(HERE, "mtp-prompts.txt")) if l.strip()]
    tot = {"compared": 0, "agree": 0, "pn_drafts": 0, "llama_drafts": 0, "pn_acc": 0, "llama_acc": 0}
    dump = []
    for p in prompts:
        pr, lr = pn_rounds(a.pn, a.model, p, a.n, a.gen, a.kv_type), llama_rounds(a.llama, a.model, p, a.n, a.gen)
        same, both, agree = compare(pr, lr)
        pd, ld = stream(pr, 1)[1], stream(lr, 0)[1]
        tot["compared"] += both
        tot["agree"] += agree
        tot["pn_drafts"] += len(pd)
        tot["llama_drafts"] += len(ld)
        tot["pn_acc"] += sum(r[1] for r in pr)
        tot["llama_acc"] += sum(r[1] for r in lr)
        print(f"{p!r}: texts agree for {same} tokens; drafts at the same index {both}, same token {agree}; "
              f"acceptance pn {sum(r[1] for r in pr)}/{len(pd)}, llama.cpp {sum(r[1] for r in lr)}/{len(ld)}")
        dump.append({"prompt": p, "pn": pr, "llama": lr})
    c = max(tot["compared"], 1)
    print(f"total: {tot['agree']}/{tot['compared']} drafts agree ({100 * tot['agree'] / c:.1f}%); acceptance pn "
          f"{100 * tot['pn_acc'] / max(tot['pn_drafts'], 1):.1f}%, llama.cpp {100 * tot['llama_acc'] / max(tot['llama_drafts'], 1):.1f}%")
    if a.fixture:
        fx = {"about": "llama-speculative-simple --spec-type draft-mtp --temp 0 rounds on the default model: [drafts, accepted, next target token]; "
                       "regenerate: bench/mtp_oracle_drafts.py --n 1 --fixture tests/fixtures/mtp-llama-drafts.json",
              "n": a.n, "gen": a.gen, "prompts": [{"prompt": d["prompt"], "rounds": d["llama"]} for d in dump]}
        with open(a.fixture, "w") as f:
            json.dump(fx, f, separators=(",", ":"))
            f.write("\n")
    if a.json:
        json.dump({"n": a.n, "gen": a.gen, "kv_type": a.kv_type, "prompts": dump}, open(a.json, "w"))


if __name__ == "__main__":
    sys.exit(main())
