"""reasoning-gym's own scores (Open-Thought, `reasoning_gym`, Apache-2.0; Stojanovski et al. 2025,
"REASONING GYM: Reasoning Environments for Reinforcement Learning with Verifiable Rewards",
arXiv:2505.24760): a task's `score_answer(answer, entry)` on the answer the completion gives in
the format its prompt asked for.

A ground truth is a reference to the problem, not a copy of it, as JSON:

    {"task": "leg_counting", "seed": 0, "size": 1000, "index": 17, "options": {},
     "format": "tag", "answer": "42"}

The verifier builds the task's dataset as the data source did (`create_dataset(task, seed=,
size=, **options)`, cached per worker) and takes entry `index`, so `score_answer` sees the
entry exactly as generated, metadata and all (a JSON round trip would turn its tuples into
lists, which some scores compare). `answer` is there for people reading samples; the score
never reads it.

The answer is extracted first, by `format`: `tag`, the last `<answer>...</answer>`
(`extract.extract_answer_tag`; reasoning-gym's `utils.extract_answer` takes the last match of
`<answer>\\s?(.*?)\\s?</answer>`, the same text for one pair) or `boxed`, the last `\\boxed{}`.
reasoning-gym's training examples do the same (`examples/trl/grpo.py`: `extract_answer(c)`,
then `score_answer`). A completion without one scores 0 and `score_answer` is not called:
handed the raw completion, the default `ProceduralDataset.score_answer` gives
len(answer) / len(completion) to any completion that merely contains the answer
("There are 42 legs." scores 2/18 on an answer of 42). Within the tag the task's own rule
holds, partial credit included: `<answer>42 legs</answer>` scores 2/7, unless the ground truth
says `"partial_credit": false` (data.reasoning_gym.partial_credit): then only full marks count.
That default rule is gamed inside the tag too: GRPO on simple_equations (answers 1-10) learnt to
write `\\boxed{15.56}`, which contains the answer 6 and earns 1/5.

The verifier runs isolated (a worker process, `reward.timeout` per sample): some tasks' scores
parse the answer with sympy, whose `parse_expr` evaluates Python, and model output is never
evaluated in the training process.

Problems are generated under a fixed string hash seed (`Generator`, docs/reasoning-gym.md): five
tasks iterate over sets of strings (ransom_note's letters, word lists), whose order follows the
interpreter's hash seed, random per process unless PYTHONHASHSEED is set, and list_functions draws
from the global `random`, so the same (task, seed, size, index) gave another problem in every
process. The reward workers are fresh interpreters (`rewards.pool`: `python -m
reasonrl.rewards.worker`), not forks of the process that wrote the prompt, so they rebuilt another
problem (with another answer for polynomial_multiplication, word_ladder, knight_swap,
list_functions); a resumed run and a second run of one config drew other problems. Every entry the
data source and the verifier read comes from a child interpreter started with PYTHONHASHSEED=0
(or from this one, when its hash seed is already 0), the global `random` seeded per problem: the
same entries in every process. It costs one interpreter start and one import of reasoning-gym per
process that generates (the data loader, each reward worker, during its warmup): 1.4-1.9 s to the
first problem with the 2-core EPYC at load 5 (11-15 s at load 19); loading configs/reasoning_gym.yaml's
1,050 problems took 4.8 s against 1.8 s in-process. The child then idles (120 MB) until the process
ends. The task's `score_answer` runs here, on the dataset built in this process and the entry from
the child (bench/reasoning_gym_hash_seed.py: no task's score of its reference answers depends on
the hash seed).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

from reasonrl.errors import GroundTruthError, MissingExtraError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer_tag, extract_boxed
from reasonrl.rewards.numeric import canonical_answer

INSTALL = "pip install 'reasonrl[reasoning-gym]'"
SOURCE = "reasoning_gym/"  # an example's data_source: reasoning_gym/<task> (as reasoning-gym's verl example)
EXTRACTORS = {"tag": extract_answer_tag, "boxed": extract_boxed}


def library() -> Any:
    """The `reasoning_gym` module, or MissingExtraError naming the extra to install."""
    try:
        import reasoning_gym
    except ImportError:
        raise MissingExtraError(f"reasoning-gym tasks need the reasoning-gym package: {INSTALL}") from None
    return reasoning_gym


# The generator: the code the child interpreter runs (`python -c`), the standard library and
# reasoning-gym only (importing reasonrl would import torch: 2 s more). A request is a pickled
# tuple after its length (8 bytes, little-endian), and so is the reply:
#   ("entries", task, seed, size, options, weights, indices) -> ("ok", [entry, ...], {name: seed})
#       options: the task's options as JSON; weights: None, or for task "composite" the JSON list
#       [[name, weight, options], ...]; the mapping gives a composite's sub-datasets' seeds
#   ("raw", ...): as "entries", the global `random` left as it is (what reasoning-gym alone gives)
#   ("scores", task, seed, size, options, weights, [(answer, entry), ...]) -> ("ok", [score, ...], {})
#   ("ready", None, 0, 0, "{}", None, []) -> ("ok", [], {}) once reasoning-gym is imported
#   -> ("refused", error type, message): create_dataset refused the options (its validate)
#   -> ("failed", index, error type, message): the task raised generating problem `index`
#   -> ("error", error type, message): anything else
# Replies go to a copy of fd 1 taken at start; fd 1 then points at stderr, so whatever a task
# prints cannot corrupt them. The child ends when its stdin closes (its parent is gone).
GENERATOR = r"""
import json, os, pickle, random, signal, struct, sys

DATASETS = {}


def build(task, seed, size, options, weights):
    key = (task, seed, size, options, weights)
    if key not in DATASETS:
        import reasoning_gym

        if weights is None:
            made = reasoning_gym.create_dataset(task, seed=seed, size=size, **json.loads(options))
        else:
            from reasoning_gym.composite import DatasetSpec

            specs = [DatasetSpec(name=n, weight=w, config=c) for n, w, c in json.loads(weights)]
            made = reasoning_gym.create_dataset(task, seed=seed, size=size, datasets=specs)
        if len(DATASETS) >= 16:
            DATASETS.pop(next(iter(DATASETS)))
        DATASETS[key] = made
    return DATASETS[key]


def item(dataset, task, seed, i):
    # Problem i, the global `random` seeded from the task, its seed and i meanwhile (and restored):
    # list_functions draws from it, so its problems differed in every process. A composite's
    # problem i is its k-th task's problem i, k drawn as reasoning-gym's CompositeDataset draws it,
    # and the global seed is that task's, as the verifier asks for the problem on its own.
    names = getattr(dataset, "dataset_names", None)
    if names:
        task = names[random.Random(seed + i).choices(range(len(names)), weights=dataset.weights, k=1)[0]]
        seed = dataset.datasets[task].seed
    state = random.getstate()
    random.seed(f"{task}/{seed}/{i}")
    try:
        entry = dataset[i]
    finally:
        random.setstate(state)
    if names and entry["metadata"]["source_dataset"] != task:
        raise RuntimeError(f"the composite's problem {i} is not {task}'s, as drawn here")
    return entry


def answer(request):
    op, task, seed, size, options, weights, items = request
    if op == "ready":
        import reasoning_gym  # noqa: F401
        return ("ok", [], {})
    try:
        dataset = build(task, seed, size, options, weights)
    except (AssertionError, ValueError, TypeError) as err:
        return ("refused", type(err).__name__, str(err))
    if op == "scores":
        return ("ok", [dataset.score_answer(a, e) for a, e in items], {})
    entries = []
    for i in items:
        try:
            entries.append(dataset[i] if op == "raw" else item(dataset, task, seed, i))
        except Exception as err:
            return ("failed", i, type(err).__name__, str(err))
    seeds = {n: d.seed for n, d in getattr(dataset, "datasets", {}).items()}
    return ("ok", entries, seeds)


def serve():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        head = requests.read(8)
        if len(head) < 8:
            return
        request = pickle.loads(requests.read(struct.unpack("<Q", head)[0]))
        try:
            data = pickle.dumps(answer(request), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:
            data = pickle.dumps(("error", type(err).__name__, str(err)))
        try:
            replies.write(struct.pack("<Q", len(data)) + data)
            replies.flush()
        except BrokenPipeError:  # the parent is gone (a reward worker killed at its deadline)
            return


if __name__ == "__main__":
    serve()
"""


class Refused(Exception):
    """create_dataset refused a task's options: `kind` (the error's type) and `message`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


class GenerationFailed(Exception):
    """The task raised generating problem `index`."""

    def __init__(self, index: int, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.index, self.kind, self.message = index, kind, message


def fixed_hash_seed() -> bool:
    """Whether this interpreter's string hashes are the generator's (PYTHONHASHSEED=0): then
    problems are generated here, without a child."""
    return sys.flags.hash_randomization == 0


class Generator:
    """reasoning-gym's problems as an interpreter with PYTHONHASHSEED=`hash_seed` generates them:
    a child started on first use (or by `start`) that lives until `close`, this process's exit
    or its stdin closing (idle meanwhile: 120 MB resident with reasoning-gym imported). One
    request at a time (a lock); a request interrupted (a reward worker's alarm) or a child that
    died takes the child down, and the next request starts another; a forked process starts its
    own."""

    def __init__(self, hash_seed: str = "0") -> None:
        self.hash_seed = hash_seed
        self.proc: subprocess.Popen | None = None
        self.owner = 0  # the pid that started the child: a forked copy of this object starts its own
        self.lock = threading.Lock()
        atexit.register(self.close)

    def start(self) -> None:
        """Start the child if it is not running (returns at once; it imports reasoning-gym
        meanwhile)."""
        if self.owner != os.getpid():
            self.proc = None  # the parent's child, its pipes shared: never written from this process
        if self.proc is not None and self.proc.poll() is None:
            return
        env = dict(os.environ, PYTHONHASHSEED=self.hash_seed,
                   PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        self.proc = subprocess.Popen([sys.executable, "-c", GENERATOR], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.owner = os.getpid()

    def ask(self, request: tuple) -> tuple:
        with self.lock:
            self.start()
            proc = self.proc
            try:
                data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.write(struct.pack("<Q", len(data)) + data)
                proc.stdin.flush()
                head = proc.stdout.read(8)
                if len(head) < 8:
                    raise RuntimeError(f"reasoning-gym's generator (PYTHONHASHSEED={self.hash_seed}) exited "
                                       f"with {proc.wait()}: its error is above")
                return pickle.loads(proc.stdout.read(struct.unpack("<Q", head)[0]))
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and self.owner == os.getpid():
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@functools.lru_cache(maxsize=1)
def _here() -> dict:
    """GENERATOR's functions, run in this interpreter (its hash seed is already 0)."""
    namespace = {"__name__": "reasonrl_reasoning_gym_generator"}
    exec(compile(GENERATOR, "<reasoning-gym generator>", "exec"), namespace)
    return namespace


_GENERATOR = Generator()


def start_generator() -> None:
    """Start this process's generator child now (a no-op when the hash seed is already 0)."""
    if not fixed_hash_seed():
        _GENERATOR.start()


def generate(op: str, task: str, seed: int, size: int, options: str, weights: str | None,
             items: list) -> tuple[list, dict]:
    """One GENERATOR request, answered under PYTHONHASHSEED=0: here when this interpreter's hash
    seed is 0, else by the child. (results, a composite's sub-datasets' seeds); Refused,
    GenerationFailed, RuntimeError for anything else."""
    library()  # MissingExtraError here rather than an ImportError from the child
    request = (op, task, seed, size, options, weights, list(items))
    reply = _here()["answer"](request) if fixed_hash_seed() else _GENERATOR.ask(request)
    if reply[0] == "ok":
        return reply[1], reply[2]
    if reply[0] == "refused":
        raise Refused(reply[1], reply[2])
    if reply[0] == "failed":
        raise GenerationFailed(*reply[1:])
    raise RuntimeError(f"reasoning-gym's generator failed on {task}: {reply[1]}: {reply[2]}")


@functools.lru_cache(maxsize=16)
def problem_set(task: str, seed: int, size: int, options: str, weights: str | None = None
                ) -> tuple[tuple[dict, ...], dict]:
    """All `size` entries of a task's dataset (`weights`: a composite's) as generated under
    PYTHONHASHSEED=0, and a composite's sub-datasets' seeds (cached: the data source asks once per
    set; the entries are shared, not to be changed)."""
    entries, seeds = generate("entries", task, seed, size, options, weights, range(size))
    return tuple(entries), seeds


@dataclass(frozen=True)
class Reference:
    """One problem of a reasoning-gym task: what `create_dataset` is given, and the index."""

    task: str
    seed: int
    size: int
    index: int
    options: str  # the task's options as sorted JSON (hashable: the cache key)
    format: str  # "tag" or "boxed": where the prompt asked for the answer
    answer: str | None = None  # the task's answer, for reading (None where the task checks instead)
    partial_credit: bool = True  # false: a task score below full marks counts 0

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "seed": self.seed, "size": self.size, "index": self.index,
                           "options": json.loads(self.options), "format": self.format,
                           "answer": self.answer, "partial_credit": self.partial_credit}, sort_keys=True)


def options_key(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


def parse_reference(ground_truth: str) -> Reference:
    """The `Reference` a ground truth holds; GroundTruthError naming what is wrong."""
    try:
        record = json.loads(ground_truth)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise GroundTruthError(f"a reasoning-gym ground truth is a JSON object {{task, seed, size, index, "
                               f"options, format}} naming the problem, got {ground_truth[:80]!r}")
    missing = [k for k in ("task", "seed", "size", "index", "format") if k not in record]
    if missing:
        has = ", ".join(sorted(record)) or "nothing"
        raise GroundTruthError(f"missing {', '.join(missing)} (it has {has})")
    task, seed, size, index, fmt = (record[k] for k in ("task", "seed", "size", "index", "format"))
    options = record.get("options") or {}
    if not isinstance(task, str) or not task:
        raise GroundTruthError(f"task must be a task name, got {task!r}")
    for key, value in (("seed", seed), ("size", size), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GroundTruthError(f"{key} must be an integer >= 0, got {value!r}")
    if not index < size:
        raise GroundTruthError(f"index {index} is outside the task's {size} problems")
    if fmt not in EXTRACTORS:
        raise GroundTruthError(f"format must be one of {', '.join(EXTRACTORS)}, got {fmt!r}")
    if not isinstance(options, dict):
        raise GroundTruthError(f"options must be an object, got {options!r}")
    answer = None if record.get("answer") is None else str(record["answer"])
    partial = record.get("partial_credit", True)
    if not isinstance(partial, bool):
        raise GroundTruthError(f"partial_credit must be true or false, got {partial!r}")
    return Reference(task, seed, size, index, options_key(options), fmt, answer, partial)


@functools.lru_cache(maxsize=64)
def dataset(task: str, seed: int, size: int, options: str) -> Any:
    """reasoning-gym's dataset of `task` (cached: several tasks build tables or read data files
    once). ValueError / TypeError / AssertionError as reasoning-gym raises them."""
    return library().create_dataset(task, seed=seed, size=size, **json.loads(options))


@functools.lru_cache(maxsize=4096)
def entry(ref: Reference) -> dict:
    """The problem `ref` names, as the task generates it under PYTHONHASHSEED=0 (cached: some
    tasks take 0.1-0.3 s)."""
    try:
        return generate("entries", ref.task, ref.seed, ref.size, ref.options, None, [ref.index])[0][0]
    except Refused as err:
        raise GroundTruthError(f"reasoning-gym cannot build {ref.task} with options {ref.options}: "
                               f"{err}") from None


def check_reference(completion: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """The start-up check of a ground truth, with the verifier's signature (it runs in the
    reward workers too): it parses, and its task exists with these options. 1.0, or
    GroundTruthError."""
    ref = parse_reference(ground_truth)
    try:
        dataset(ref.task, ref.seed, ref.size, ref.options)
    except (ValueError, TypeError, AssertionError) as err:
        raise GroundTruthError(f"reasoning-gym cannot build {ref.task} with options {ref.options}: "
                               f"{type(err).__name__}: {err}") from None
    return 1.0


def given_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The answer a completion commits to for the evaluation's majority vote and format-error
    rate (which see no ground truth, hence no format): the last `<answer>` text, else the last
    `\\boxed{}`, whitespace removed; never a bare number."""
    answer = extract_answer_tag(completion)
    return canonical_answer(answer if answer is not None else extract_boxed(completion), numeric=False)


@VERIFIERS.register(
    "reasoning_gym", doc="reasoning-gym: the task's own score_answer of the answer in <answer> / \\boxed{}",
    isolated=True, check=check_reference, answer=given_answer)
def reasoning_gym_reward(completion: str, ground_truth: str,
                         extra_info: dict | None = None) -> dict[str, float]:
    """{"score": the task's `score_answer` of the extracted answer (0 without one; with
    partial_credit false, 0 below full marks), "answer_found": 1 when the completion gives an answer
    in the format its prompt asked for, "task_score": the task's own score}."""
    ref = parse_reference(ground_truth)
    answer = EXTRACTORS[ref.format](completion)
    if answer is None:
        return {"score": 0.0, "answer_found": 0.0, "task_score": 0.0}
    task_score = float(dataset(ref.task, ref.seed, ref.size, ref.options).score_answer(answer, entry(ref)))
    score = task_score if ref.partial_credit or task_score >= 1.0 else 0.0
    return {"score": score, "answer_found": 1.0, "task_score": task_score}


def _warmup() -> None:
    """Start the generator child, import reasoning-gym here meanwhile (1.5 s each, its 105 tasks)
    and wait for the child to have imported it too, when a worker loads the verifier, so the first
    sample is not charged for them against reward.timeout."""
    start_generator()
    library()
    generate("ready", "", 0, 0, "{}", None, [])


reasoning_gym_reward.warmup = _warmup
check_reference.warmup = _warmup
