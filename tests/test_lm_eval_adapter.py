"""titan-lm-eval (docs/evaluation.md): lm-evaluation-harness's LM interface over a titan checkpoint.

The adapter's log-likelihoods are titan-eval's for the same requests; a real lm_eval run through
titan-lm-eval on a local task folder (no hub) gives titan-eval's accuracies on the same examples,
its bits per byte from titan-eval's nll, and titan's greedy continuations; a missing lm_eval or a bad
checkpoint is one line and exit 2."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from titan_core.evaluation import load_tasks

from conftest import trained

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'titan-core[lmeval]')")

LIMIT = 12  # examples of the multiple-choice task run through lm_eval
MC_YAML = """task: titan_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""
PPL_YAML = """task: titan_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: text
metric_list:
  - metric: bits_per_byte
"""
GEN_YAML = """task: titan_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: context
doc_to_target: "{{{{choices[gold]}}}}"
generation_kwargs:
  until: ["e", "\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("lm_eval") / "run"
    trained(run, "training.steps=2", "checkpoint.enable=true", "metrics.report=false")
    return run


def _instances(*args: tuple[object, ...]) -> list[SimpleNamespace]:
    return [SimpleNamespace(args=a) for a in args]


def test_the_adapter_scores_each_request_as_titan_eval_does(run_dir: Path) -> None:
    from titan_core.commands.lm_eval_model import TitanLM
    from titan_core.evaluation.requests import document_windows
    from titan_core.evaluation.results import prepare_tasks, score_task
    from titan_core.evaluation.scoring import score_requests

    assert {"titan", "hf", "dummy"} <= set(lm_eval.api.registry.model_registry)  # lm_eval's own models stay found
    # lm_eval's CLI passes its own batch_size (default 1) and device: the model_args' values win. The batches are
    # titan-eval's (8): a float32 sum over other batches differs in the last bits (1.4e-6 at batch size 3).
    lm = TitanLM.create_from_arg_string(f"checkpoint={run_dir},batch_size=8", {"batch_size": 1, "device": "cpu"})
    assert lm.batch_size == 8 and lm.loaded.device == torch.device("cpu")
    mc, text = load_tasks(["builtin"])
    prepared = prepare_tasks([mc], lm.tokenizer, window=lm.window)[0]
    with torch.no_grad():
        reference = score_task(prepared, lm.loaded.model, window=lm.window, batch_size=8, device=torch.device("cpu"))
    ours = lm.loglikelihood(_instances(*((ex.context, choice) for ex in mc.examples for choice in ex.choices)))
    assert len(ours) == len(reference.loglikelihood) == 160
    worst = max(abs(ll - ref) for (ll, _), ref in zip(ours, reference.loglikelihood))
    assert worst <= 1e-6, worst
    assert [greedy for _, greedy in ours] == reference.greedy

    # Each built-in document fits the model's window: lm_eval's rolling windows are titan-eval's one window.
    rolling = lm.loglikelihood_rolling(_instances(*((doc.text,) for doc in text.examples)))
    with torch.no_grad():
        for doc, value in zip(text.examples, rolling):
            windows = document_windows(doc, lm.tokenizer, window=lm.window)
            assert len(windows) == 1
            expected = sum(score_requests(windows, lm.loaded.model, window=lm.window, batch_size=8,
                                          device=torch.device("cpu"), pad_id=lm.tokenizer.eos_id).loglikelihood)
            assert abs(value - expected) <= 1e-6, (doc.line, value, expected)
    assert lm.loglikelihood(_instances(("a", ""))) == [(0.0, True)]  # nothing to predict



def test_generate_until_samples_when_the_task_asks_with_titans_seeded_sampler(run_dir: Path) -> None:
    from titan_core.commands.lm_eval_model import TitanLM
    from titan_core.errors import ConfigError
    from titan_core.models.sampling import Sampling, sample, takes_cache

    lm = TitanLM.create_from_arg_string(f"checkpoint={run_dir},seed=3", {"device": "cpu"})
    context = "The cat sat"

    def titan(sampling: Sampling) -> str:
        new = sample(lm.loaded.model, lm.tokenizer.encode(context, bos=True), sampling, eos_id=lm.tokenizer.eos_id,
                     use_cache=takes_cache(lm.loaded.model))
        return lm.tokenizer.decode(new[:-1] if new and new[-1] == lm.tokenizer.eos_id else new)

    def ours(**kwargs: object) -> str:
        return lm.generate_until(_instances((context, {"max_gen_toks": 12, "until": [], **kwargs})))[0]

    sampled = ours(do_sample=True, temperature=0.9, top_k=20)
    assert sampled == titan(Sampling(max_new_tokens=12, temperature=0.9, top_k=20, seed=3))
    assert ours(do_sample=True, temperature=0.9, top_k=20) == sampled  # seeded: a rerun gives the same text
    assert ours(temperature=0.9, top_k=20) == sampled  # a temperature with do_sample unset samples (lm_eval's HF rule)
    greedy = titan(Sampling(max_new_tokens=12))
    assert ours() == ours(do_sample=False, temperature=0.9) == greedy
    seeds = {ours(do_sample=True, seed=seed) for seed in range(4)}  # temperature 1.0 among every token
    assert seeds == {titan(Sampling(max_new_tokens=12, temperature=1.0, seed=seed)) for seed in range(4)}
    assert len(seeds | {greedy}) > 1  # it really samples
    for kwargs, says in (({"do_sample": True, "top_p": 0.9}, "top_p=0.9 (nucleus sampling) is not supported"),
                         ({"do_sample": True, "temperature": -1}, "temperature=-1 must be a number of at least 0"),
                         ({"do_sample": True, "top_k": "many"}, "top_k='many' must be a whole number"),
                         ({"do_sample": "yes"}, "do_sample='yes' must be true or false"),
                         ({"do_sample": True, "seed": -2}, "seed=-2 must be a whole number")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            ours(**kwargs)
    for seed in ("x", "-1", "1.5"):  # the model argument, as lm_eval hands it over (text, or a number it parsed)
        with pytest.raises(ConfigError, match=rf"seed='?{re.escape(seed)}'? must be a whole number of at least 0"):
            TitanLM.create_from_arg_string(f"checkpoint={run_dir},seed={seed}", {"device": "cpu"})

def test_lm_eval_on_a_local_task_folder_gives_titan_evals_figures(run_dir: Path, tmp_path: Path, capsys,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval.tasks

    from titan_core.commands.evaluate import main as eval_main
    from titan_core.commands.lm_eval_cli import main
    from titan_core.models.sampling import Sampling, sample
    from titan_core.train.whole_model import load_titan_checkpoint

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    if "datasets" in sys.modules:  # imported by an earlier test of this worker: it read the variables then
        config = sys.modules["datasets"].config
        for name, value in (("HF_HUB_OFFLINE", True), ("HF_DATASETS_OFFLINE", True),
                            ("HF_DATASETS_CACHE", tmp_path / "hf_cache")):
            monkeypatch.setattr(config, name, value)

    class LocalTasksOnly(lm_eval.tasks.TaskManager):  # type: ignore[misc]
        """lm_eval indexes its ~thousands of built-in task files first (seconds); the test needs only its own."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasksOnly)
    mc, text = load_tasks(["builtin"])
    data = tmp_path / "data"
    data.mkdir()
    (data / "mc.jsonl").write_text("".join(mc.path.read_text().splitlines(keepends=True)[:LIMIT]))
    (data / "docs.jsonl").write_text(text.path.read_text())
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "titan_mc.yaml").write_text(MC_YAML.format(data=data / "mc.jsonl"))
    (folder / "titan_ppl.yaml").write_text(PPL_YAML.format(data=data / "docs.jsonl"))
    (folder / "titan_gen.yaml").write_text(GEN_YAML.format(data=data / "mc.jsonl"))

    out = tmp_path / "out"
    code = main(["--model", "titan", "--model_args", f"checkpoint={run_dir},batch_size=4", "--tasks", "titan_mc",
                 "titan_ppl", "titan_gen", "--include_path", str(folder), "--limit", str(LIMIT),
                 "--output_path", str(out), "--log_samples", "--device", "cpu"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "|titan_mc " in printed.out  # lm_eval's table
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]

    assert eval_main([str(run_dir), "--tasks", str(data / "mc.jsonl"), str(data / "docs.jsonl")]) == 0
    titan = json.loads(capsys.readouterr().out)
    assert titan["eval/mc/examples"] == LIMIT
    with capsys.disabled():
        print(f"\ntitan-eval {titan}\nlm_eval {results}")
    assert results["titan_mc"]["acc,none"] == titan["eval/mc/acc"]
    assert results["titan_mc"]["acc_norm,none"] == titan["eval/mc/acc_norm"]

    # bits per byte = -(summed log-likelihood) / (bytes x ln 2); titan-eval's nll is per predicted token.
    whole = load_titan_checkpoint(run_dir / "checkpoints" / "step-000002")
    tokens = sum(len(whole.tokenizer.encode(doc.text, bos=True)) - 1 for doc in text.examples)
    size = sum(len(doc.text.encode("utf-8")) for doc in text.examples)
    expected_bpb = titan["eval/docs/nll"] * tokens / (size * math.log(2))
    assert math.isclose(results["titan_ppl"]["bits_per_byte,none"], expected_bpb, rel_tol=1e-6)

    (samples_file,) = out.rglob("samples_titan_gen_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == LIMIT
    cut = 0
    for s in samples:
        prompt = whole.tokenizer.encode(s["doc"]["context"], bos=True)
        new = sample(whole.model.eval(), prompt, Sampling(max_new_tokens=6), eos_id=whole.tokenizer.eos_id)
        whole_text = whole.tokenizer.decode([t for t in new if t != whole.tokenizer.eos_id])
        greedy = whole_text.split("e", 1)[0].split("\n", 1)[0]
        assert s["resps"] == [[greedy]], (s["resps"], greedy)
        cut += greedy != whole_text
    assert cut > 0  # some continuations did reach a stop string

    # The same command on a folder that holds no checkpoint: one line, exit 2, no traceback.
    code = main(["--model", "titan", "--model_args", f"checkpoint={data}", "--tasks", "titan_mc", "--include_path",
                 str(folder), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and f"titan-lm-eval: error: {data} is not a titan checkpoint" in err and "Traceback" not in err


def test_plain_lm_eval_finds_the_titan_model(run_dir: Path, tmp_path: Path, capsys) -> None:
    """``lm_eval --model titan`` itself, in a fresh process: titan-core's .pth hook registers the adapter when lm_eval
    loads its models (lm_eval reads no entry points). Without the hook lm_eval answers "no model for this name"."""
    import subprocess

    from titan_core.commands.evaluate import main as eval_main

    mc, _ = load_tasks(["builtin"])
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(mc.path.read_text().splitlines(keepends=True)[:LIMIT]))
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "titan_mc.yaml").write_text(MC_YAML.format(data=data))
    lm_eval_script = Path(sys.executable).parent / "lm_eval"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "out"
    proc = subprocess.run([str(lm_eval_script), "--model", "titan", "--model_args", f"checkpoint={run_dir},batch_size=4",
                           "--tasks", "titan_mc", "--include_path", str(folder), "--device", "cpu",
                           "--output_path", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (results_file,) = out.rglob("results_*.json")
    acc = json.loads(results_file.read_text())["results"]["titan_mc"]["acc,none"]
    assert eval_main([str(run_dir), "--tasks", str(data)]) == 0
    assert acc == json.loads(capsys.readouterr().out)["eval/mc/acc"]


def test_a_missing_lm_eval_or_a_bad_checkpoint_is_one_line_and_exit_2(tmp_path: Path, capsys,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.commands.lm_eval_cli import main
    from titan_core.commands.lm_eval_model import TitanLM
    from titan_core.errors import ConfigError

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
        assert main(["--model", "titan", "--model_args", f"checkpoint={tmp_path}", "--tasks", "x"]) == 2
    err = capsys.readouterr().err
    assert "titan-lm-eval: error: lm-evaluation-harness (the lm_eval module) is not installed; pip install " \
           "'titan-core[lmeval]' adds it." in err and "Traceback" not in err

    for args, message in ((f"checkpoint={tmp_path / 'nope'}", f"{tmp_path / 'nope'} does not exist"),
                          (f"checkpoint={tmp_path}", "is not a titan checkpoint"),
                          ("", "needs the model to read: --model_args checkpoint=PATH"),
                          (f"checkpoint={tmp_path},batch_size=0", "batch_size=0 must be a positive whole number"),
                          (f"checkpoint={tmp_path},dtype=bf16", "unknown model argument dtype")):
        with pytest.raises(ConfigError) as caught:
            TitanLM.create_from_arg_string(args, {"device": "cpu"})
        assert message in str(caught.value), (args, str(caught.value))
