"""Rewards from models on the default task: how often a model's reward agrees with the rule
verifier, and the seconds it adds to a step. One run; the machine's load is printed with it.

    python bench/judge.py                                   # the figures of docs/judges.md (~15 min, 2 cores)
    python bench/judge.py --per-prompt 1 --train-prompts 0   # a smoke: 100 completions, no reward model
    python bench/judge.py --out judge.json                   # every figure (and each row's scores) as JSON

1. Completions: the embedded SmolLM2-135M-Instruct (the default run's policy before training) samples
   `--per-prompt` completions (5) of each of the default task's 100 held-out problems with
   configs/default.yaml's sampling (temperature 1.0, 40 new tokens): 500 completions, labelled
   right or wrong by the rule verifier (`correct`).
2. The generative judge: the same embedded model, frozen, in its reward-model worker process
   (reward.weights {judge: 1}, configs/judge.yaml's settings): (a) the default reference-guided
   rubric (question, reference answer, response), its verdict P(Yes) / (P(Yes) + P(No)), on the
   500; on the first `--subset` (100) of them, (b) a reference-free rubric (question and response
   only), its verdict, and (c) the reference-guided rubric asking for a number from 0 to 10
   (parse=number, 4 new tokens).
3. A reward model trained here: SmolLM2-135M-Instruct with a one-label head
   (AutoModelForSequenceClassification, the head freshly initialised), trained for `--epochs` on
   the completions of `--train-prompts` training problems (8 each: disjoint from the 100 held-out
   problems), labelled by the rule (binary cross-entropy weighted to balance the two labels,
   AdamW, lr `--lr`, batches of 8), saved, and scored through reward.weights {classifier: 1} on the
   same 500 (its reward: the logit; threshold 0).
4. Agreement with the rule, per model reward: accuracy and Cohen's kappa at the threshold (0.5 for
   a probability, 0 for a logit) with the confusion matrix, ROC AUC (threshold-free: the chance
   that a right completion scores above a wrong one), the mean score of right and of wrong ones,
   and rows that failed (counted failures score 0).
5. Seconds per step added: the default step scores 32 completions; the rule alone: the median
   of 5 such batches; a model: its pass's seconds per completion (batches of 8, its worker warm,
   the load not counted) x 32, and its load in its worker apart (once per run, and again after a
   timeout's kill).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from reasonrl.accel import calibrate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reasonrl.config import load_config  # noqa: E402
from reasonrl.data import load_examples  # noqa: E402
from reasonrl.model.load import resolve_model_dir  # noqa: E402
from reasonrl.placement import build_workers  # noqa: E402
from reasonrl.rewards import score_examples  # noqa: E402
from reasonrl.rewards.judging import classifier_text  # noqa: E402
from reasonrl.rollout import SamplingParams  # noqa: E402

REFERENCE_FREE = ("Question: {question}\n\nResponse: {completion}\n\n"
                  "Is the response's final answer correct? Answer Yes or No.")
NUMBER = ("Question: {question}\n\nReference answer: {ground_truth}\n\nResponse: {completion}\n\n"
          "How correct is the response's final answer, from 0 (wrong) to 10 (equal to the reference)? "
          "Answer with the number only.")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def cpu_model() -> str:
    return calibrate.cpu_model()  # lscpu's model name


def cohen_kappa(rule: list[bool], model: list[bool]) -> float:
    """kappa = (p_o - p_e) / (1 - p_e): observed agreement p_o against the agreement p_e two raters
    with these label rates reach by chance (Cohen 1960, "A Coefficient of Agreement for Nominal
    Scales", eq. 1); 0 when p_e = 1 (one label everywhere)."""
    n = len(rule)
    p_o = sum(a == b for a, b in zip(rule, model, strict=True)) / n
    r, m = sum(rule) / n, sum(model) / n
    p_e = r * m + (1 - r) * (1 - m)
    return 0.0 if p_e == 1 else (p_o - p_e) / (1 - p_e)


def roc_auc(scores: list[float], labels: list[bool]) -> float:
    """P(score of a right completion > score of a wrong one), ties counted half: the area under the
    ROC curve as the Mann-Whitney U statistic over n_pos * n_neg (Hanley and McNeil 1982)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def agreement(scores: list[float], labels: list[bool], threshold: float, failed: int) -> dict:
    said = [s > threshold for s in scores]
    tp = sum(a and b for a, b in zip(labels, said, strict=True))
    tn = sum(not a and not b for a, b in zip(labels, said, strict=True))
    fp = sum(not a and b for a, b in zip(labels, said, strict=True))
    fn = sum(a and not b for a, b in zip(labels, said, strict=True))
    right = [s for s, y in zip(scores, labels, strict=True) if y]
    wrong = [s for s, y in zip(scores, labels, strict=True) if not y]
    return {"accuracy": (tp + tn) / len(labels), "kappa": cohen_kappa(labels, said),
            "auc": roc_auc(scores, labels),
            "confusion": {"rule_right_model_yes": tp, "rule_right_model_no": fn, "rule_wrong_model_yes": fp,
                          "rule_wrong_model_no": tn},
            "mean_right": statistics.fmean(right) if right else float("nan"),
            "mean_wrong": statistics.fmean(wrong) if wrong else float("nan"),
            "threshold": threshold, "failed": failed}


def generate(rollout, examples, per_prompt: int, seed: int):
    """`per_prompt` completions of each example (configs/default.yaml's sampling)."""
    torch.manual_seed(seed)
    sampling = SamplingParams(n=per_prompt, temperature=1.0, top_p=1.0, max_new_tokens=40)
    texts, rows = [], []
    for start in range(0, len(examples), 8):
        out = rollout.rollout(examples[start: start + 8], sampling)
        texts += out.texts
        rows += out.examples
    return texts, rows


def model_scores(name: str, changes: dict, texts, rows) -> tuple[list[float], int, float, object]:
    """Each row's score by the model component `name` with configs/judge.yaml's reward.model and
    `changes` (failures score 0), the failures, the load seconds of its worker, the reward config."""
    full = load_config(REPO / "configs" / "judge.yaml", [f"reward.weights={{{name}: 1.0}}"])
    cfg = dataclasses.replace(full.reward, model=dataclasses.replace(full.reward.model, **changes))
    t = time.perf_counter()
    workers = build_workers(dataclasses.replace(full, reward=cfg), roles=("judge",))  # the model loaded
    loaded = time.perf_counter() - t
    try:
        scores = score_examples(texts, rows, cfg, judge=workers.judge)
    finally:
        workers.close()
    return scores.components[name].tolist(), sum(f is not None for f in scores.failures), loaded, cfg


def step_seconds(cfg, texts, rows, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        score_examples(texts, rows, cfg)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def train_reward_model(texts, rows, labels, epochs: int, lr: float, folder: Path) -> dict:
    """A one-label SmolLM2-135M-Instruct classifier trained on the rule's labels (see the module
    docstring), saved to `folder`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = resolve_model_dir("")
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    inputs = [classifier_text(tokenizer, e.prompt, c) for c, e in zip(texts, rows, strict=True)]
    positives = sum(labels)
    balance = torch.tensor((len(labels) - positives) / max(positives, 1))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=balance)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order, losses, t = list(range(len(inputs))), [], time.perf_counter()
    model.train()
    for epoch in range(epochs):
        random.Random(epoch).shuffle(order)
        for start in range(0, len(order), 8):
            batch = order[start: start + 8]
            enc = tokenizer([inputs[i] for i in batch], return_tensors="pt", padding=True,
                            add_special_tokens=False)
            logits = model(**enc).logits[:, 0]
            loss = loss_fn(logits, torch.tensor([float(labels[i]) for i in batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tenth = max(1, len(losses) // 10)
    return {"examples": len(inputs), "right": positives, "epochs": epochs, "lr": lr, "steps": len(losses),
            "seconds": time.perf_counter() - t, "loss_first_tenth": statistics.fmean(losses[:tenth]),
            "loss_last_tenth": statistics.fmean(losses[-tenth:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-prompt", type=int, default=5, help="completions of each held-out problem (100)")
    ap.add_argument("--train-prompts", type=int, default=32, help="training problems (x 8 completions) for "
                    "the "
                    "reward model; 0: none trained")
    ap.add_argument("--subset", type=int, default=100, help="completions the other two judges score")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    result = {"cpu": cpu_model(), "torch_threads": torch.get_num_threads(), "load_before": load()}
    print(f"[bench] {result['cpu']}, {result['load_before']}", flush=True)
    started = time.perf_counter()

    cfg = load_config(REPO / "configs" / "default.yaml", ["data.arithmetic.val_size=100"])
    train_examples, held_out = load_examples(cfg.data, cfg.trainer.seed)
    workers = build_workers(cfg)
    t = time.perf_counter()
    texts, rows = generate(workers.rollout, held_out, args.per_prompt, args.seed)
    train_texts, train_rows = ([], []) if not args.train_prompts else generate(
        workers.rollout, train_examples[: args.train_prompts], 8, args.seed + 1)
    workers.close()
    rule = score_examples(texts, rows, cfg.reward).components["correct"]
    labels = [bool(v >= 1.0) for v in rule.tolist()]
    result.update(completions=len(texts), right=sum(labels), generate_seconds=time.perf_counter() - t)
    print(f"[bench] {len(texts)} completions of {len(held_out)} held-out problems, {sum(labels)} right by "
          f"the rule ({time.perf_counter() - t:.0f} s)", flush=True)

    step_texts, step_rows = texts[:32], rows[:32]
    rule_cfg = cfg.reward
    result["step_seconds"] = {"rule only": step_seconds(rule_cfg, step_texts, step_rows)}
    every, some = len(texts), min(args.subset, len(texts))
    runs = [("judge, reference-guided, verdict", "judge", {}, 0.5, every),
            ("judge, reference-free, verdict", "judge", {"template": REFERENCE_FREE}, 0.5, some),
            ("judge, reference-guided, number 0-10", "judge",
             {"parse": "number", "max_new_tokens": 4, "template": NUMBER}, 0.5, some)]
    result["models"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.train_prompts:
            correct = score_examples(train_texts, train_rows, cfg.reward).components["correct"]
            train_labels = [bool(v >= 1.0) for v in correct.tolist()]
            print(f"[bench] training the reward model on {len(train_texts)} completions "
                  f"({sum(train_labels)} right)", flush=True)
            result["reward_model_training"] = train_reward_model(train_texts, train_rows, train_labels,
                                                                 args.epochs, args.lr, Path(tmp) / "rm")
            runs.append(("reward model trained here (classifier)", "classifier",
                         {"path": str(Path(tmp) / "rm")}, 0.0, every))
        for label, name, changes, threshold, n in runs:
            t = time.perf_counter()
            scores, failed, loaded, _ = model_scores(name, changes, texts[:n], rows[:n])
            seconds = time.perf_counter() - t - loaded
            entry = agreement(scores, labels[:n], threshold, failed)
            entry.update(rows=n, load_seconds=loaded, score_seconds=seconds, step_seconds=seconds / n * 32,
                         scores=scores)
            result["models"][label] = entry
            print(f"[bench] {label} ({n} completions): accuracy {entry['accuracy']:.3f}, "
                  f"kappa {entry['kappa']:.3f}, "
                  f"AUC {entry['auc']:.3f}, {entry['confusion']}, mean right {entry['mean_right']:.3f} "
                  f"wrong {entry['mean_wrong']:.3f}, failed {failed}; load {loaded:.1f} s, "
                  f"{entry['step_seconds']:.2f} s per 32 completions ({load()})", flush=True)
    result["step_seconds"].update({k: v["step_seconds"] for k, v in result["models"].items()})
    result.update(load_after=load(), total_seconds=time.perf_counter() - started, labels=labels)

    print(f"\nmachine: {result['cpu']}, torch threads {result['torch_threads']}; "
          f"before: {result['load_before']}; "
          f"after: {result['load_after']}; {result['total_seconds'] / 60:.1f} min in all")
    print(f"{result['completions']} completions, {result['right']} right by the rule "
          f"({result['right'] / result['completions']:.1%})\n")
    print("| model reward | completions (right) | accuracy | Cohen's kappa | ROC AUC | confusion (rule "
          "right: yes/no; wrong: yes/no) | mean score right / wrong | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for label, m in result["models"].items():
        c = m["confusion"]
        right = c["rule_right_model_yes"] + c["rule_right_model_no"]
        print(f"| {label} | {m['rows']} ({right}) | {m['accuracy']:.3f} | {m['kappa']:.3f} | "
              f"{m['auc']:.3f} | "
              f"{c['rule_right_model_yes']}/{c['rule_right_model_no']}; {c['rule_wrong_model_yes']}/"
              f"{c['rule_wrong_model_no']} | {m['mean_right']:.3f} / {m['mean_wrong']:.3f} | {m['failed']} |")
    print("\n| reward | seconds per step (32 completions; a model: its pass's seconds per completion "
          "x 32) | "
          "added to the rule's | model load (once) |")
    print("|---|---|---|---|")
    base = result["step_seconds"]["rule only"]
    print(f"| rule only (`correct`) | {base:.3f} | - | - |")
    for label, m in result["models"].items():
        print(f"| {label} | {m['step_seconds']:.2f} | +{m['step_seconds'] - base:.2f} | "
              f"{m['load_seconds']:.1f} s |")
    if "reward_model_training" in result:
        r = result["reward_model_training"]
        print(f"\nreward model: {r['examples']} completions ({r['right']} right), {r['epochs']} epoch(s), "
              f"{r['steps']} steps, {r['seconds']:.0f} s; loss {r['loss_first_tenth']:.3f} -> "
              f"{r['loss_last_tenth']:.3f} (first and last tenth of the steps)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    if any(math.isnan(m["auc"]) for m in result["models"].values()):
        print("(AUC is nan where the rule gave one label only)")


if __name__ == "__main__":
    main()
