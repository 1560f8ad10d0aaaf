"""The extraction pipeline on Ray Data (`leapgen extract --ray`): the same job, output and resume rule,
with one LLM per actor across a local or existing Ray cluster.

The driver reads the input, drops the ids already in the output, checks the schema against the model's
tokenizer, and is the only writer: actors return output lines, the driver appends them with the local
pipeline's writer, so a retried task can never write an id twice.  Ray is an optional extra
(`pip install 'leapgen[ray]'`) imported only here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterator

from leapgen.extraction import (DEFAULT_BATCH_SIZE, WINDOW_BATCHES, ExtractJob, ExtractPlan, ExtractSummary,
                                check_budget, check_context, run_records, write_lines)
from leapgen.extraction_io import Record


class ExtractorActor:
    """A Ray Data actor holding one LLM: turns a batch of records into their output lines."""

    def __init__(self, model: str | None, llm_options: dict[str, Any], job: ExtractJob) -> None:
        from leapgen.llm import LLM

        self.llm = LLM(model, **llm_options)
        self.job = job

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        records = [Record(**json.loads(text)) for text in batch["record"]]
        return {"line": [json.dumps(line, ensure_ascii=False) for line in run_records(self.llm, records, self.job)]}


def run_on_ray(plan: ExtractPlan, model: str | Path | None, *, workers: int = 2, address: str | None = None,
               llm_options: dict[str, Any] | None = None, ray_options: dict[str, Any] | None = None,
               progress: bool = True) -> ExtractSummary:
    """Run the plan's pending records on `workers` Ray actors (a local cluster, or the one at `address`) and
    append their lines to the plan's output.  `ray_options` go to each actor (`num_cpus`, `num_gpus`, ...)."""
    if model is not None and not isinstance(model, (str, Path)):
        raise ValueError("ray: pass the model as a path (each worker loads its own), not a loaded LLM")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    ray = _import_ray()
    if not plan.pending:
        return write_lines([], plan, progress)
    _check_schema(model, plan.job)
    started = _connect(ray, address)
    try:
        actor = _actor_resources(ray, workers, ray_options or {})
        options = {"threads": max(1, math.floor(actor.get("num_cpus", 1))), **(llm_options or {})}
        model = None if model is None else str(Path(model).expanduser().absolute())   # workers' cwd may differ
        lines = _lines(ray, plan, model, workers, options, actor)
        return write_lines(lines, plan, progress)
    finally:
        if started:                      # a cluster this call started; one the caller runs is left as it was
            ray.shutdown()


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise ValueError("ray: Ray Data is not installed; pip install 'leapgen[ray]'") from None
    return ray


def _check_schema(model: str | Path | None, job: ExtractJob) -> None:
    """Compile the schema for the model's tokenizer on the driver, so a bad schema fails before any worker
    starts (the driver never loads the weights)."""
    from leapgen.engine.config import ModelConfig, read_json
    from leapgen.engine.default_model import default_model_path
    from leapgen.engine.gguf_loader import convert_gguf
    from leapgen.engine.loader import load_tokenizer

    path = default_model_path() if model is None else Path(model).expanduser()
    try:
        if path.suffix == ".gguf" and not path.is_dir():
            path = convert_gguf(path)    # once here; workers on this machine reuse the conversion
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the tokenizer of {path}: {exc}") from None
    try:
        compiled = job.constraint().compile(tokenizer)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"schema: {exc}") from None
    check_budget(compiled, job.params().max_tokens)
    try:                                 # the context, as the workers' engines will read it
        context = ModelConfig.from_dict(read_json(path / "config.json")).max_model_len
    except (OSError, ValueError):        # a model leapgen runs through the transformers fallback: they will say
        return
    check_context(job.params().max_tokens, context)


def _connect(ray, address: str | None) -> bool:
    """Join the cluster at `address`, or start a local one on this machine's loopback; True if started here."""
    if ray.is_initialized():
        return False
    # log_to_driver=False: workers' output stays in Ray's logs; a failure reaches the user as one error naming
    # the worker's own exception (see _cause), after what Ray itself prints about failed actors
    if address is not None:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count() or 1, _node_ip_address="127.0.0.1", include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)
    # before the next line, which would warn; Ray Data's own error logs repeat the exception run_on_ray reports
    logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    ray.data.DataContext.get_current().enable_progress_bars = False     # leapgen shows its own bar
    return True


def _actor_resources(ray, workers: int, ray_options: dict[str, Any]) -> dict[str, Any]:
    """Each actor's resources: as given, else an equal share of the cluster's CPUs but one (half of them on a
    machine of one or two) left to Ray Data's own tasks: actors holding every CPU leave it waiting for ever."""
    if "num_cpus" in ray_options:
        return dict(ray_options)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return {"num_cpus": (cpus - min(1.0, cpus / 2)) / workers, **ray_options}


def _lines(ray, plan: ExtractPlan, model: str | None, workers: int, llm_options: dict[str, Any],
           actor: dict[str, Any]) -> Iterator[dict[str, Any]]:
    # an equal share of a small job for each worker; a large one in batches of WINDOW_BATCHES engine batches
    window = WINDOW_BATCHES * llm_options.get("max_num_seqs", DEFAULT_BATCH_SIZE)
    batch_size = min(math.ceil(len(plan.pending) / workers), window)
    dataset = ray.data.from_items([{"record": json.dumps(dataclasses.asdict(record))} for record in plan.pending])
    results = dataset.map_batches(
        ExtractorActor, fn_constructor_kwargs={"model": model, "llm_options": llm_options, "job": plan.job},
        batch_size=batch_size, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=min(workers, math.ceil(len(plan.pending) / batch_size)),
                                           max_tasks_in_flight_per_actor=1),
        **actor)
    try:
        for batch in results.iter_batches(batch_size=None, batch_format="numpy"):
            for text in batch["line"]:
                yield json.loads(text)
    except ray.exceptions.RayError as exc:
        raise ValueError(f"ray: a worker failed: {_cause(exc)}") from None


def _cause(exc: BaseException) -> str:
    """The worker's own error, without Ray's wrapping and remote traceback."""
    cause = getattr(exc, "cause", None) or exc
    lines = [line for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"
