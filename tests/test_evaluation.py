"""[eval] and titan-eval (docs/evaluation.md): a bad task file stops a run and titan-eval, the figures logged during
training and drawn by titan-report, titan-eval on a checkpoint and on the exported Hugging Face folder,
the log-likelihoods against transformers' LlamaForCausalLM, and FSDP2, CP, PP, TP and EP (a MoE model) against
one process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from titan_core.evaluation import load_tasks

from conftest import PARITY_TOLERANCE, SMALL_RUN, assert_user_error, titan, torchrun, trained


def test_bad_task_file_stops_titan_train_and_titan_eval_before_training(tmp_path: Path, cli, capsys) -> None:
    from titan_core.commands.evaluate import main as eval_main

    task = tmp_path / "bad.jsonl"
    task.write_text('{"context": "a", "choices": [" b"], "gold": 0}\n')
    result = cli(*(f"--{p}" for p in SMALL_RUN), f"--job.run_dir={tmp_path / 'run'}", f"--eval.tasks={task}")
    assert_user_error(result, f"{task}:1: 'choices' has 1 entry; give at least two")
    assert "step" not in result.out
    assert eval_main([str(tmp_path), "--tasks", str(task)]) == 2
    err = capsys.readouterr().err
    assert f"titan-eval: error: {task}:1:" in err and "Traceback" not in err


def _eval_records(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if any(k.startswith("eval/") for k in r)]


def _titan_logliks(model: torch.nn.Module, tokenizer, window: int) -> tuple[list[list[int]], list[int], list[float]]:
    """Every request of the built-in tasks: (its context+targets, its number of targets, titan's log-likelihood)."""
    from titan_core.evaluation.results import prepare_tasks, score_task

    rows, counts, lls = [], [], []
    with torch.no_grad():
        for prepared in prepare_tasks(load_tasks(["builtin"]), tokenizer, window=window):
            scores = score_task(prepared, model, window=window, batch_size=8, device=torch.device("cpu"))
            lls += scores.loglikelihood
            for r in prepared.requests:
                rows.append(list(r.context + r.targets)[-(window + 1):])
                counts.append(len(r.targets))
    return rows, counts, lls


def test_eval_during_training_titan_eval_and_transformers_agree(tmp_path: Path, capsys) -> None:
    """A short run evaluates at steps 2 and 4; its report draws a curve per task; titan-eval on the last checkpoint
    and on the exported HF folder gives the run's last figures; and every request's log-likelihood equals the one
    transformers' LlamaForCausalLM computes on the exported folder (fp32) within 1e-5."""
    from transformers import LlamaForCausalLM

    from titan_core.commands.evaluate import main as eval_main

    run_dir = tmp_path / "run"
    trainer, _ = trained(run_dir, "training.steps=4", "eval.tasks=builtin", "eval.interval=2",
                         "checkpoint.enable=true", "checkpoint.export_at_end=true", "checkpoint.export_format=hf")
    records = _eval_records(run_dir)
    assert [int(r["step"]) for r in records] == [2, 4]
    last = records[-1]
    assert last["eval/python_syntax/examples"] == 40 and last["eval/python_text/examples"] == 8
    assert 0 <= last["eval/python_syntax/acc"] <= 1 and 0 <= last["eval/python_syntax/acc_norm"] <= 1
    assert math.isclose(last["eval/python_text/ppl"], math.exp(last["eval/python_text/nll"]), rel_tol=1e-12)
    report = (run_dir / "report.html").read_text()
    assert 'data-metric="eval-python_syntax-acc"' in report and 'data-metric="eval-python_text-ppl"' in report

    for source in (run_dir, run_dir / "export" / "hf"):
        out = tmp_path / f"{source.name}.json"
        assert eval_main([str(source), "--tasks", "builtin", "--output", str(out)]) == 0, capsys.readouterr().err
        again = json.loads(out.read_text())
        assert sorted(again) == sorted(k for k in last if k != "step")
        assert all(abs(again[k] - last[k]) <= 1e-6 * max(1.0, abs(last[k])) for k in again), (source, again, last)

    window = trainer.model_args.max_seq_len
    rows, counts, ours = _titan_logliks(trainer.model_parts[0].eval(), trainer.tokenizer, window)
    reference = LlamaForCausalLM.from_pretrained(run_dir / "export" / "hf", dtype=torch.float32).eval()
    theirs = []
    with torch.no_grad():
        for row, n in zip(rows, counts):
            logits = reference(torch.tensor([row[:-1]])).logits[0, -n:].float()
            picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(row[-n:])[:, None])
            theirs.append(picked.double().sum().item())
    worst = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"{len(ours)} requests: largest |titan - transformers| log-likelihood difference {worst:.3g}")
    assert len(ours) == len(theirs) > 40 * 4 and worst <= 1e-5, worst


def test_fsdp2_cp2_pp2_and_tp2_on_two_processes_score_as_one_process(tmp_path: Path) -> None:
    """The same weights (lr 0: the initial ones) scored by one process, by FSDP2 over 2 gloo processes (each rank
    taking half of the requests), by context parallelism over 2 (both cp ranks scoring every request on whole
    sequences, with the weights sharded over them), by pipeline parallelism over 2 (the stream handed from
    stage to stage, the last stage's rank scoring) and by tensor parallelism over 2 (heads and vocabulary
    split, both ranks scoring every request): the same figures."""
    common = ("training.steps=1", "optimizer.lr=0", "eval.tasks=builtin", "eval.limit=12", "eval.batch_size=4")
    trained(tmp_path / "one", *common)
    (one_record,) = _eval_records(tmp_path / "one")
    for layout, flags in (("fsdp2", ("--training.local_batch_size=2", "--parallelism.dp_shard=2")),
                          ("cp2", ("--parallelism.cp=2",)), ("pp2", ("--parallelism.pp=2",)),
                          ("tp2", ("--parallelism.tp=2",))):
        two = torchrun(tmp_path / layout, *(f"--{p}" for p in SMALL_RUN), *flags, *(f"--{p}" for p in common),
                       "--metrics.report=false")
        assert two.code == 0, two.text
        (two_record,) = _eval_records(tmp_path / layout)
        assert sorted(one_record) == sorted(two_record)
        print(f"{layout}: largest difference", max(abs(two_record[k] - v) for k, v in one_record.items()))
        for key, value in one_record.items():
            assert abs(two_record[key] - value) <= PARITY_TOLERANCE * max(1.0, abs(value)), (layout, key, value,
                                                                                             two_record[key])



def test_moe_under_expert_parallelism_scores_as_one_process_with_an_uneven_split(tmp_path: Path) -> None:
    """qwen3 debugmoe, EP 2 (each rank holds half the experts and every forward exchanges tokens over both):
    13 requests split 7 / 6 over the two ranks still score as one process, without either rank waiting for
    ever on an exchange the other never joins."""
    common = ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.seq_len=64",
              "--training.steps=1", "--optimizer.lr=0", "--eval.tasks=builtin", "--eval.limit=13",
              "--eval.batch_size=4", "--metrics.report=false", "--training.seed=0")
    one = titan(tmp_path / "one", *common, "--training.local_batch_size=2")
    ep = titan(tmp_path / "ep", *common, "--training.local_batch_size=1", "--parallelism.ep=2", nproc=2, timeout=240)
    assert one.code == 0 and ep.code == 0, one.text + ep.text
    assert "ep:S(0)" in ep.text, ep.text
    (one_record,), (ep_record,) = _eval_records(tmp_path / "one"), _eval_records(tmp_path / "ep")
    assert sorted(one_record) == sorted(ep_record) and one_record["eval/python_syntax/examples"] == 13
    for key, value in one_record.items():
        assert abs(ep_record[key] - value) <= PARITY_TOLERANCE * max(1.0, abs(value)), (key, value, ep_record[key])

def test_eval_weights_ema_scores_the_average_that_titan_eval_finds_in_the_ema_export(tmp_path: Path, capsys) -> None:
    """With eval.weights=ema the run scores its EMA (swapped in for the evaluation): titan-eval on the EMA
    export gives the same figures, and they differ from those of the trained weights (the raw export)."""
    from titan_core.commands.evaluate import main as eval_main

    common = ("training.steps=3", "eval.tasks=builtin", "eval.limit=6", "eval.interval=3", "ema.decay=0.5",
              "checkpoint.export_at_end=true", "checkpoint.export_format=hf", "metrics.report=false")
    trained(tmp_path / "ema", *common, "eval.weights=ema", "checkpoint.export_weights=ema")
    trained(tmp_path / "raw", *common)
    (ema_record,), (raw_record,) = _eval_records(tmp_path / "ema"), _eval_records(tmp_path / "raw")
    assert ema_record["eval/python_text/nll"] != raw_record["eval/python_text/nll"]
    for run, record in (("ema", ema_record), ("raw", raw_record)):
        out = tmp_path / f"{run}.json"
        assert eval_main([str(tmp_path / run / "export" / "hf"), "--tasks", "builtin", "--limit", "6",
                          "--output", str(out)]) == 0, capsys.readouterr().err
        again = json.loads(out.read_text())
        assert all(abs(again[k] - record[k]) <= 1e-6 * max(1.0, abs(record[k])) for k in again), (run, again, record)


def test_eval_weights_ema_without_an_ema_is_refused(tmp_path: Path, cli) -> None:
    result = cli(*(f"--{p}" for p in SMALL_RUN), f"--job.run_dir={tmp_path / 'run'}", "--eval.tasks=builtin",
                 "--eval.weights=ema")
    assert_user_error(result, "eval.weights=ema scores the EMA of the weights: set ema.decay")
