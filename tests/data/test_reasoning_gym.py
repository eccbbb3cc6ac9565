"""reasoning-gym's tasks as a data source and verifier (reasonrl/data/reasoning_gym.py,
reasonrl/rewards/reasoning_gym.py, reasonrl/config/reasoning_gym.py): the same problems for the
same seed, held-out problems from a seed range the training one never meets, options reaching
the generator, composite mixtures, the answer extracted before the task's score_answer (hand
computed on real entries), and two training steps of the tiny model on configs/reasoning_gym.yaml.

The values below are reasoning-gym 0.1.25's (the version the extra pins): a task's problem i is
drawn from Random(seed + i), so the texts are fixed by the seed and the library's version."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys

import pytest

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, DataError, GroundTruthError, MissingExtraError
from reasonrl.rewards.verifiers import task_for_source

RG = ["data.task=reasoning_gym", "data.train_path=reasoning_gym:leg_counting"]


def cfg_of(*overrides: str):
    return load_config(None, [*RG, "data.reasoning_gym.size=20", "data.reasoning_gym.val_size=5", *overrides])


# ---- the config's rules: no reasoning-gym needed ----------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (["data.task=file"], "data.task: data.train_path=reasoning_gym:leg_counting names a reasoning-gym task, "
                         "which data.task=reasoning_gym reads; set it (data.task=file does not)"),
    (["data.train_path="], "data.train_path: required when data.task=reasoning_gym"),
    (["data.train_path=train.jsonl"], "data.train_path: 'train.jsonl' is not reasoning_gym:<task>"),
    (["data.train_path=reasoning_gym:composite"],
     "data.reasoning_gym.weights: reasoning_gym:composite needs"),
    (["data.reasoning_gym.weights={gcd: 1.0}"], "data.reasoning_gym.weights: set, but no path is "
                                                "reasoning_gym:composite"),
    (["data.train_path=reasoning_gym:composite", "data.reasoning_gym.weights={gcd: 0}"],
     "data.reasoning_gym.weights.gcd: must be > 0, got 0"),
    (["data.train_path=reasoning_gym:composite,reasoning_gym:gcd", "data.reasoning_gym.weights={gcd: 1}"],
     "data.train_path: reasoning_gym:composite mixes the tasks of data.reasoning_gym.weights"),
    (["data.train_path=reasoning_gym:gcd,reasoning_gym:gcd"],
     "data.train_path: reasoning_gym:gcd is listed twice"),
    (["data.reasoning_gym.options.seed=3"],
     "data.reasoning_gym.options.seed: set by data.reasoning_gym.seed"),
    (["data.train_path=reasoning_gym:gcd,reasoning_gym:lcm", "data.reasoning_gym.options.max_value=9"],
     "data.reasoning_gym.options.max_value: with several tasks the options are one mapping per task"),
    (["data.train_path=reasoning_gym:gcd,reasoning_gym:lcm", "data.reasoning_gym.options.chain_sum={}"],
     "data.reasoning_gym.options.chain_sum: not a task of this run (gcd, lcm)"),
    # training seeds 0..19, held-out 10..14: problem i is drawn from seed + i, so they would meet
    (["data.reasoning_gym.val_seed=10"], "data.reasoning_gym.val_seed: the held-out problems (seeds 10..14) "
                                         "overlap the training problems (seeds 0..19): reasoning-gym draws "
                                         "problem i from seed + i, so the sets would share problems; use "
                                         "val_seed >= 20"),
    (["data.reasoning_gym.seed=30", "data.reasoning_gym.val_seed=27"], "use val_seed >= 50 or <= 25"),
])
def test_the_config_refuses_what_cannot_run(overrides, message):
    with pytest.raises(ConfigError) as err:
        cfg_of(*overrides)
    assert message in str(err.value)


def test_seed_ranges_that_touch_but_do_not_meet_are_allowed():
    assert cfg_of("data.reasoning_gym.val_seed=20").data.reasoning_gym.val_seed == 20  # 0..19 and 20..24
    assert cfg_of("data.reasoning_gym.seed=5", "data.reasoning_gym.val_seed=0").data.reasoning_gym.seed == 5
    assert cfg_of("data.reasoning_gym.val_size=0", "data.reasoning_gym.val_seed=3")  # no held-out set


def test_reasoning_gym_sources_are_scored_by_its_verifier():
    assert task_for_source("reasoning_gym/leg_counting") == "reasoning_gym"
    assert task_for_source("leg_counting") == "numeric"


def test_without_the_package_one_message_names_the_extra(monkeypatch):
    from reasonrl.data import load_examples
    from reasonrl.rewards.reasoning_gym import reasoning_gym_reward

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(MissingExtraError) as err:
        load_examples(cfg_of().data, 0)
    assert str(err.value) == ("reasoning-gym tasks need the reasoning-gym package: "
                              "pip install 'reasonrl[reasoning-gym]'")
    truth = json.dumps({"task": "leg_counting", "seed": 0, "size": 1, "index": 0, "format": "tag"})
    with pytest.raises(MissingExtraError):
        reasoning_gym_reward("<answer>4</answer>", truth)


# ---- with reasoning-gym --------------------------------------------------------------------------

needs_rg = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym is not installed: pip install 'reasonrl[reasoning-gym]'")


def examples(*overrides: str):
    from reasonrl.data import load_examples

    return load_examples(cfg_of(*overrides).data, 0)


def truth(e) -> dict:
    return json.loads(e.ground_truth)


@needs_rg
def test_the_same_seed_gives_the_same_problems_and_another_seed_others():
    a, b = examples(), examples()
    assert [(e.prompt, e.ground_truth) for e in a[0] + a[1]] == [
        (e.prompt, e.ground_truth) for e in b[0] + b[1]]
    train, held_out = a
    assert len(train) == 20 and len(held_out) == 5
    assert train[0].prompt.startswith(  # problem 0 of seed 0: 5 x 6 + 8 x 0 + 6 x 4 + ... = 500 legs
        "Your task is to count how many legs there are in total when given a list of animals.\n\n"
        "Now, how many legs are there in total if you have 5 grasshoppers, 8 jellyfishs, 6 tigers, "
        "10 scorpions, 15 spiders, 15 wasps, 4 praying mantiss, 9 crabs, 3 woodlouses?\n\n"
        "Give only your final answer, between <answer> and </answer>.")
    assert truth(train[0]) == {"task": "leg_counting", "seed": 0, "size": 20, "index": 0, "options": {},
                               "format": "tag", "answer": "500", "partial_credit": True}
    assert train[0].data_source == "reasoning_gym/leg_counting"
    assert train[0].meta["origin"] == "reasoning_gym:leg_counting[seed 0]:0"
    other = examples("data.reasoning_gym.seed=100", "data.reasoning_gym.val_seed=200")
    assert {e.prompt for e in other[0]}.isdisjoint(e.prompt for e in train)
    # reasoning-gym's seeds shift its problems: seed 3's problem 0 is seed 0's problem 3 (the
    # overlap the config's rule refuses)
    shifted = examples("data.reasoning_gym.seed=3", "data.reasoning_gym.val_seed=100")[0]
    assert shifted[0].prompt == train[3].prompt


@needs_rg
def test_held_out_problems_come_from_their_own_seed_range_and_never_from_training():
    train, held_out = examples()
    assert [(truth(e)["seed"], truth(e)["index"]) for e in held_out] == [(1_000_000, i) for i in range(5)]
    assert {truth(e)["seed"] for e in train} == {0}
    assert {e.prompt for e in train}.isdisjoint(e.prompt for e in held_out)


@needs_rg
def test_a_training_problem_that_asks_a_held_out_question_is_left_out_and_said(capsys):
    # one animal, one of it: 37 questions in all (reasoning-gym's ANIMALS), so 100 training draws
    # repeat the 5 held-out ones
    options = ["data.reasoning_gym.size=100", "data.reasoning_gym.options={min_animals: 1, max_animals: 1, "
               "min_instances: 1, max_instances: 1}"]
    train, held_out = examples(*options)
    asked = {e.prompt for e in held_out}
    assert not asked & {e.prompt for e in train}
    from reasonrl.config import ReasoningGymConfig
    from reasonrl.data.reasoning_gym import problems

    rg = cfg_of(*options).data.reasoning_gym
    assert isinstance(rg, ReasoningGymConfig)
    every = problems("leg_counting", 0, 100, rg, False, "data.train_path")
    repeats = sum(e.prompt in asked for e in every)
    assert repeats > 0 and len(train) == 100 - repeats
    assert (f"[reasonrl] data.reasoning_gym: {repeats} of the 100 leg_counting training problems ask a "
            "held-out question (val_seed 1000000) and are left out") in capsys.readouterr().out


@needs_rg
def test_options_reach_the_generator_and_bad_ones_are_named():
    train, _ = examples("data.reasoning_gym.options={min_animals: 1, max_animals: 1, min_instances: 2, "
                        "max_instances: 2}")
    for e in train:  # "if you have 2 <animal>s?": one kind of animal, two of it
        question = e.prompt.split("if you have ")[1].split("?")[0]
        assert question.startswith("2 ") and "," not in question, question
        assert truth(e)["options"] == {"max_animals": 1, "max_instances": 2, "min_animals": 1,
                                       "min_instances": 2}
    with pytest.raises(DataError) as err:
        examples("data.reasoning_gym.options.max_animalz=3")
    assert str(err.value).startswith(
        "data.reasoning_gym.options.max_animalz: leg_counting has no such option; "
        "its options: min_animals, max_animals, min_instances, max_instances")
    with pytest.raises(DataError) as err:
        examples("data.reasoning_gym.options={min_animals: 5, max_animals: 2}")
    assert str(err.value) == ('data.reasoning_gym.options: leg_counting refuses {"max_animals": 2, '
                              '"min_animals": 5}: AssertionError: max_animals must be >= min_animals')
    with pytest.raises(DataError) as err:
        examples("data.train_path=reasoning_gym:leg_countin")
    assert str(err.value).startswith("data.train_path: reasoning_gym:leg_countin: no such reasoning-gym task "
                                     "(did you mean 'leg_counting'?); its 105 tasks: ab, acre, ")


@needs_rg
def test_options_under_the_tasks_name_in_a_run_of_one_task_and_a_failing_generator_are_named(monkeypatch):
    with pytest.raises(DataError) as err:
        examples("data.reasoning_gym.options={leg_counting: {max_animals: 3}}")
    assert str(err.value).startswith(
        "data.reasoning_gym.options.leg_counting: leg_counting has no such option (a run of one task takes "
        "its options directly: data.reasoning_gym.options.<option>); its options: min_animals")
    from reasoning_gym.factory import DATASETS

    from reasonrl.rewards import reasoning_gym as verifier

    def broken(self, idx):
        raise ValueError("boom")

    monkeypatch.setattr(DATASETS["leg_counting"][0], "__getitem__", broken)
    monkeypatch.setattr(verifier, "fixed_hash_seed", lambda: True)  # generated here, where the patch is
    verifier.problem_set.cache_clear()
    with pytest.raises(DataError) as err:
        examples()
    assert str(err.value) == ("reasoning_gym:leg_counting (seed 1000000) problem 0: reasoning-gym failed to "
                              "generate it: ValueError: boom")


@needs_rg
def test_several_tasks_each_with_their_own_options_and_size():
    train, held_out = examples("data.train_path=reasoning_gym:leg_counting,reasoning_gym:chain_sum",
                               "data.reasoning_gym.options={chain_sum: {min_terms: 2, max_terms: 2}}")
    legs, chain = "reasoning_gym/leg_counting", "reasoning_gym/chain_sum"
    assert [e.data_source for e in train] == [legs] * 20 + [chain] * 20
    assert [e.data_source for e in held_out] == [legs] * 5 + [chain] * 5
    for e in train[20:]:  # "... problem: 1663 - 5242 = ": two terms
        expression = e.prompt.split("problem: ")[1].split(" =")[0]
        assert len(expression.split(" ")) == 3, expression


@needs_rg
def test_a_composite_mixes_tasks_by_weight_as_reasoning_gym_draws_them():
    from reasonrl.rewards.reasoning_gym import reasoning_gym_reward

    train, held_out = examples("data.train_path=reasoning_gym:composite", "data.reasoning_gym.seed=5",
                               "data.reasoning_gym.size=12",
                               "data.reasoning_gym.weights={leg_counting: 1.0, chain_sum: 3.0}")
    # reasoning-gym's CompositeDataset: entry i is task k's entry i, k = Random(seed + i).choices by weight
    picks = [random.Random(5 + i).choices([0, 1], weights=[1.0, 3.0], k=1)[0] for i in range(12)]
    assert picks == [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1]
    assert [e.data_source for e in train] == [("reasoning_gym/leg_counting", "reasoning_gym/chain_sum")[k]
                                              for k in picks]
    # each refers to its task's own dataset, seeded as the composite seeds it (seed + k + 1)
    assert [(truth(e)["task"], truth(e)["seed"], truth(e)["index"]) for e in train[2:4]] == [
        ("chain_sum", 7, 2), ("leg_counting", 6, 3)]
    import reasoning_gym

    asked = reasoning_gym.create_dataset("leg_counting", seed=6, size=12)[3]["question"]
    assert train[3].prompt.startswith(asked)
    for e in train + held_out:  # and its own score_answer scores the right answer in full
        assert reasoning_gym_reward(f"<answer>{truth(e)['answer']}</answer>", e.ground_truth)["score"] == 1.0
    assert {truth(e)["seed"] for e in held_out} <= {1_000_001, 1_000_002}


@needs_rg
@pytest.mark.parametrize("completion, score, found", [
    ("<answer>500</answer>", 1.0, 1.0),
    ("The legs: 500.", 0.0, 0.0),                 # the answer, not in the tag: 0 (raw: 3/14)
    ("There are 500 legs.", 0.0, 0.0),            # (raw: 3/19)
    ("<answer>500 legs</answer>", 3 / 8, 1.0),    # in the tag, the task's own partial credit: 3/8
    ("<answer>499</answer>", 0.0, 1.0),
    ("\\boxed{500}", 0.0, 0.0),                   # the prompt asked for the tag
    ("<answer>1</answer> no, <answer>500</answer>", 1.0, 1.0),  # the last one
])
def test_the_answer_is_extracted_before_score_answer(completion, score, found):
    """leg_counting's problem 0 of seed 0 (answer 500, the default ProceduralDataset.score_answer:
    1 for the answer, len(answer) / len(text) for a text containing it)."""
    from reasonrl.rewards.reasoning_gym import dataset, entry, parse_reference, reasoning_gym_reward

    train, _ = examples()
    assert reasoning_gym_reward(completion, train[0].ground_truth) == {"score": score, "answer_found": found,
                                                                       "task_score": score}
    ref = parse_reference(train[0].ground_truth)
    raw = dataset(ref.task, ref.seed, ref.size, ref.options).score_answer(completion, entry(ref))
    if "<" not in completion and "\\" not in completion:  # what passing the raw completion would give
        assert raw == pytest.approx(3 / len(completion)) and raw > 0


@needs_rg
def test_without_partial_credit_only_full_marks_count():
    """simple_equations' answers are 1-10 and its score is the default one: `\\boxed{15.56}` holds the
    answer 6 and earns 1/5, the partial credit a GRPO run learnt to collect (docs/reasoning-gym.md)."""
    from reasonrl.rewards.reasoning_gym import reasoning_gym_reward

    train, _ = examples("data.reasoning_gym.partial_credit=false")
    assert truth(train[0])["partial_credit"] is False
    assert reasoning_gym_reward("<answer>500 legs</answer>", train[0].ground_truth) == {
        "score": 0.0, "answer_found": 1.0, "task_score": 3 / 8}
    assert reasoning_gym_reward("<answer>500</answer>", train[0].ground_truth)["score"] == 1.0
    gt = json.dumps({"task": "simple_equations", "seed": 0, "size": 1, "index": 0, "format": "boxed",
                     "options": {"min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["+"],
                                 "operators_weights": [1.0]}})
    from reasonrl.rewards.reasoning_gym import entry, parse_reference

    answer = entry(parse_reference(gt))["answer"]
    wrong = f"\\boxed{{1{answer}.5}}"  # contains the answer: len(answer) / len(text)
    assert reasoning_gym_reward(wrong, gt)["score"] == pytest.approx(len(answer) / (len(answer) + 3))
    strict = json.dumps({**json.loads(gt), "partial_credit": False})
    assert reasoning_gym_reward(wrong, strict)["score"] == 0.0


@needs_rg
def test_a_tasks_own_rule_and_the_boxed_format():
    """chain_sum's problem 0 of seed 0, "1663 - 5242 - 9376 - 8961 + 7634 = ?" (-14282); its score
    (`compute_decimal_reward`) takes commas and trailing decimals, and gives the raw text "The
    answer is -14282" 6/20 = 0.3."""
    from reasonrl.rewards.reasoning_gym import dataset, entry, parse_reference, reasoning_gym_reward

    train, _ = examples("data.train_path=reasoning_gym:chain_sum", "data.reasoning_gym.answer_format=boxed")
    gt = train[0].ground_truth
    assert train[0].prompt.endswith("1663 - 5242 - 9376 - 8961 + 7634 =\n\nGive only your final answer, "
                                    "inside \\boxed{}.")
    ref = parse_reference(gt)
    assert dataset(ref.task, ref.seed, ref.size, ref.options).score_answer("The answer is -14282",
                                                                          entry(ref)) == pytest.approx(0.3)
    assert [reasoning_gym_reward(c, gt)["score"] for c in (
        "The answer is -14282", "so \\boxed{-14282}", "\\boxed{-14,282.00}", "\\boxed{14282}",
        "<answer>-14282</answer>")] == [0.0, 1.0, 1.0, 0.0, 0.0]


@needs_rg
def test_the_demo_is_one_worked_exchange_in_the_asked_format():
    train, _ = examples("data.reasoning_gym.answer_format=boxed", "data.reasoning_gym.demo=true")
    demo_q, demo_a, ask = train[0].prompt
    assert demo_q == {"role": "user",
                      "content": "What is 2 + 2?\n\nGive only your final answer, inside \\boxed{}."}
    assert demo_a == {"role": "assistant", "content": "\\boxed{4}"}
    assert ask["role"] == "user" and ask["content"].endswith("3 woodlouses?\n\nGive only your final answer, "
                                                             "inside \\boxed{}.")


@needs_rg
@pytest.mark.parametrize("ground_truth, message", [
    ("500", "a reasoning-gym ground truth is a JSON object {task, seed, size, index, options, format} naming "
            "the problem, got '500'"),
    ("{oops", "a reasoning-gym ground truth is a JSON object"),
    ('{"task": "leg_counting"}', "missing seed, size, index, format (it has task)"),
    ('{"task": "leg_counting", "seed": 0, "size": 2, "index": 2, "format": "tag"}',
     "index 2 is outside the task's 2 problems"),
    ('{"task": "leg_counting", "seed": 0, "size": 2, "index": 0, "format": "xml"}',
     "format must be one of tag, boxed, got 'xml'"),
    ('{"task": "leg_countin", "seed": 0, "size": 2, "index": 0, "format": "tag"}',
     "reasoning-gym cannot build leg_countin with options {}: ValueError: Dataset 'leg_countin' not "
     "registered"),
])
def test_a_bad_ground_truth_is_named(ground_truth, message):
    from reasonrl.rewards.reasoning_gym import check_reference

    with pytest.raises(GroundTruthError) as err:
        check_reference("", ground_truth)
    assert str(err.value).startswith(message)


@needs_rg
def test_the_reward_command_scores_a_reference(capsys):
    gt = json.dumps({"task": "leg_counting", "seed": 0, "size": 20, "index": 0, "format": "tag"})
    assert main(["reward", "--task", "reasoning_gym", "--ground-truth", gt,
                 "There are <answer>500</answer>"]) == 0
    row = next(json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    assert (row["score"], row["parts"], row["error"]) == (1.0, {"answer_found": 1.0, "task_score": 1.0}, None)


@needs_rg
def test_the_example_config_trains_the_tiny_model_two_steps(tmp_path):
    assert main(["train", "configs/reasoning_gym.yaml", "model.path=tiny", "trainer.steps=2",
                 "trainer.batch_size=8", "rollout.n=4", "rollout.max_new_tokens=8", "trainer.progress=false",
                 "tracking.report=false",
                 "data.reasoning_gym.size=16", "data.reasoning_gym.val_size=4", "optim.micro_batch_size=8",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert lines[1]["reward/errors"] == 0 and lines[1]["reward/timeouts"] == 0
    assert lines[0]["eval/num_prompts"] == 4 and "eval/accuracy" in lines[2]
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(json.loads(s["ground_truth"])["task"] == "isomorphic_strings" for s in samples)


# ---- the same problems under any string hash seed ------------------------------------------------
# ransom_note draws its letters from a set of strings, whose order follows the interpreter's hash
# seed: reasoning-gym alone gives other problems in every process. reasonrl generates them under
# PYTHONHASHSEED=0 (a child interpreter, or this one when its hash seed is already 0).

RANSOM = ["data.train_path=reasoning_gym:ransom_note", "data.reasoning_gym.size=6",
          "data.reasoning_gym.val_size=6"]


def run_python(code: str, hash_seed: str, *args: str) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, OMP_WAIT_POLICY="PASSIVE")
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout


@needs_rg
def test_reasoning_gym_alone_asks_other_ransom_notes_under_another_hash_seed():
    """The defect, in reasoning-gym itself (if this fails, the library fixed it)."""
    code = ("import pickle, sys, reasoning_gym;"
            "d = reasoning_gym.create_dataset('ransom_note', seed=0, size=6);"
            "sys.stdout.buffer.write(pickle.dumps([(e['question'], e['answer']) for e in d]))")
    assert pickle.loads(run_python(code, "0")) != pickle.loads(run_python(code, "1"))


@needs_rg
@pytest.mark.parametrize("hash_seed", ["0", "123"])
def test_the_data_source_gives_the_same_problems_under_any_hash_seed(hash_seed):
    """Hash seed 0: the other process generates in-process (no child), this one in its child (or
    in-process, if pytest runs under PYTHONHASHSEED=0); 123: both in their children."""
    code = ("import pickle, sys; from reasonrl.config import load_config; from reasonrl.data import "
            "load_examples; from reasonrl.rewards.reasoning_gym import fixed_hash_seed, _GENERATOR; "
            "train, held_out = load_examples(load_config(None, sys.argv[1:]).data, 0); "
            "rows = [(e.prompt, e.ground_truth) for e in train + held_out]; "
            "sys.stdout.buffer.write(pickle.dumps((rows, fixed_hash_seed(), _GENERATOR.proc is not None)))")
    rows, here, child = pickle.loads(run_python(code, hash_seed, *RG, *RANSOM))
    assert (here, child) == ((True, False) if hash_seed == "0" else (False, True))
    train, held_out = examples(*RANSOM)
    assert rows == [(e.prompt, e.ground_truth) for e in train + held_out]


@needs_rg
def test_the_child_and_the_in_process_generator_give_the_same_entries():
    """What `generate` returns in an interpreter whose hash seed is 0 (no child) equals what a
    PYTHONHASHSEED=0 child sends back, metadata included."""
    from reasonrl.rewards.reasoning_gym import Generator

    request = ("entries", "ransom_note", 1_000_000, 50, "{}", None, [0, 1, 2, 3, 17, 49])
    code = ("import pickle, sys; from reasonrl.rewards.reasoning_gym import generate, fixed_hash_seed, "
            "_GENERATOR; entries, _ = generate(*pickle.loads(bytes.fromhex(sys.argv[1])));"
            "assert fixed_hash_seed() and _GENERATOR.proc is None;"
            "sys.stdout.buffer.write(pickle.dumps(entries))")
    here = pickle.loads(run_python(code, "0", pickle.dumps(request).hex()))
    child = Generator("0")
    try:
        status, entries, _ = child.ask(request)
    finally:
        child.close()
    assert status == "ok" and entries == here and len(entries) == 6
    assert {e["answer"] for e in entries} == {"True", "False"}


@needs_rg
def test_the_reward_command_scores_references_in_a_process_with_another_hash_seed(tmp_path):
    """Problems made here, scored by `reasonrl reward` under PYTHONHASHSEED=123 (its verifier
    rebuilds each problem there, as a spawned reward worker or a resumed run does): every
    reference answer scores 1.0. Before the fix about half of them were another problem's."""
    _, held_out = examples(*RANSOM, "data.reasoning_gym.answer_format=boxed")
    assert {e.meta["answer"] for e in held_out} == {"True", "False"}
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({"completion": f"\\boxed{{{e.meta['answer']}}}",
                                           "ground_truth": e.ground_truth}) + "\n" for e in held_out))
    code = "import sys; from reasonrl.cli import main; sys.exit(main(sys.argv[1:]))"
    out = run_python(code, "123", "reward", "--task", "reasoning_gym", "--file", str(records)).decode()
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    scores = [r["score"] for r in rows if "score" in r][:len(held_out)]
    assert scores == [1.0] * len(held_out), out
