"""The early-exit model's prepared artifacts and the workloads built from them.

One checkpoint per task: the encoder fine-tuned with its classifier and the exit ramps trained on the
frozen encoder (:mod:`workbench.earlyexit.train`), sealed with a record of every ramp on every dev example.
From that record come accuracy and mean exit layer per threshold, and the easy and hard bins (the stock
model's confidence) from which workloads of a chosen easy:hard mix are drawn. Their batch profiles are
measured by real inference (:func:`measure_mix`); a series of windows of a mix feeds the ARIMA estimator
(:func:`profile_series`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workbench.cache import cache_dir
from workbench.data import load_task, task_spec
from workbench.earlyexit import limits
from workbench.earlyexit.batchprofile import BatchProfile, BatchProfileEstimator
from workbench.earlyexit.record import FORMAT_VERSION, RampRecord, RampTrainConfig, ramp_config
from workbench.errors import WorkbenchError
from workbench.presets import prepare_hint

MIXES = {"80:20": 0.8, "50:50": 0.5, "20:80": 0.2}
"""The paper's easy:hard mixes, as the easy fraction."""


def _key(cfg: RampTrainConfig) -> str:
    from workbench.train.checkpoints import training_key

    return training_key(cfg, FORMAT_VERSION)


def model_dir(task: str, preset: str = "full") -> Path:
    """Where ``task``'s early-exit model trained by ``preset`` lives (keyed by every training input)."""
    cfg = ramp_config(task, preset)
    return cache_dir() / "models" / f"earlyexit-{task}-{_key(cfg)}"


@dataclass
class PreparedModel:
    """A trained early-exit model with its dev record and training summary."""
    task: str
    model: object                  # EarlyExitModel
    record: RampRecord
    meta: dict

    @property
    def stock_accuracy(self) -> float:
        return self.record.stock_accuracy()


def _from(state: dict, meta: dict) -> PreparedModel:
    from workbench.earlyexit.model import EarlyExitModel
    from workbench.models.encoder import EncoderConfig

    model = EarlyExitModel(EncoderConfig(**meta["encoder"]), len(task_spec(meta["task"]).labels))
    model.load_state_dict(state, strict=True)
    model.requires_grad_(False)
    return PreparedModel(meta["task"], model.eval(), RampRecord.from_dict(meta["record"]), meta)


def prepare_model(task: str, preset: str = "full", progress: bool = True, force: bool = False) -> PreparedModel:
    """Train (or load from the cache) ``task``'s early-exit model."""
    from workbench.earlyexit.train import train_ramps
    from workbench.train.checkpoints import cached_checkpoint
    from workbench.train.resume import progress_path

    path = model_dir(task, preset)
    kept = progress_path(path)

    def build():
        model, record, info = train_ramps(ramp_config(task, preset), progress=progress, resume_path=kept)
        meta = {"task": task, "encoder": asdict(model.cfg), "record": record.to_dict(), "format": FORMAT_VERSION,
                **info}
        return model.state_dict(), meta

    prepared = _from(*cached_checkpoint(path, build, force=force, what=f"early-exit model for {task!r}"))
    kept.unlink(missing_ok=True)                  # the model is saved: the run's progress is not needed
    return prepared


def model_ready(task: str, preset: str = "full") -> bool:
    from workbench.train.checkpoints import is_checkpoint

    return is_checkpoint(model_dir(task, preset))


def _not_prepared(task: str, preset: str) -> WorkbenchError:
    return WorkbenchError(f"task {task!r} has no trained exit ramps (preset {preset!r}); "
                          f"run `{prepare_hint(preset)}` first")


def load_model(task: str, preset: str = "full") -> PreparedModel:
    """The prepared early-exit model of ``task`` (verified)."""
    from workbench.train.checkpoints import load_checkpoint

    if not model_ready(task, preset):
        raise _not_prepared(task, preset)
    return _from(*load_checkpoint(model_dir(task, preset)))


def load_record(task: str, preset: str = "full") -> RampRecord:
    """The prepared model's dev record, without loading its weights."""
    from workbench.train.checkpoints import read_meta

    if not model_ready(task, preset):
        raise _not_prepared(task, preset)
    return RampRecord.from_dict(read_meta(model_dir(task, preset))["record"])


# ----------------------------------------------------------------------------- workloads of an easy:hard mix


def check_easy_fraction(easy: float) -> float:
    """The easy share of a mix, checked (``limits.check_easy_share``)."""
    return limits.check_easy_share(easy)


def mix_rows(record: RampRecord, easy: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` dev rows drawn with replacement, a share ``easy`` of them from the easy bin, in random order."""
    easy = check_easy_fraction(easy)
    limits.workload_requests.check("a workload's requests", n)
    rng = np.random.default_rng(seed)
    easy_rows, hard_rows = record.easy_hard()
    n_easy = int(rng.binomial(n, easy))
    rows = np.concatenate([rng.choice(easy_rows, n_easy), rng.choice(hard_rows, n - n_easy)])
    return rng.permutation(rows)


def mix_profile(record: RampRecord, easy: float, threshold: float, disabled=(), n: int = 1024,
                seed: int = 0) -> BatchProfile:
    """The batch profile of a workload of mix ``easy`` from the record (the ramps' real outputs on the dev set)."""
    rows = mix_rows(record, easy, n, seed)
    return BatchProfile.from_exit_layers(record.exits(threshold, disabled)[rows], record.num_layers)


def mix_texts(prepared: PreparedModel, easy: float, n: int, seed: int = 0) -> list[str]:
    """The dev texts of :func:`mix_rows`'s workload, in its order."""
    dev = load_task(prepared.task).dev
    index = {i: j for j, i in enumerate(dev.ids)}
    return [dev.texts[index[prepared.record.dev_ids[r]]] for r in mix_rows(prepared.record, easy, n, seed)]


def measure_mix(prepared: PreparedModel, easy: float, threshold: float, n: int = 256, seed: int = 0,
                batch_size: int = 32) -> tuple[BatchProfile, np.ndarray]:
    """Real inference: run the model on a workload of mix ``easy`` and return its batch profile and the exit
    layer of each request (the same as :func:`mix_profile` computes from the record, up to float ties)."""
    import torch

    from workbench.models.tokenizer import encoder_tokenizer

    model = prepared.model.configure(threshold=threshold)
    texts = mix_texts(prepared, easy, n, seed)
    tok = encoder_tokenizer(task_spec(prepared.task).max_length)
    exits = []
    with torch.no_grad():
        for s in range(0, n, batch_size):
            ids, mask = tok(texts[s:s + batch_size])
            exits.append(model(ids, mask).exit_layers)
    layers = np.concatenate(exits)
    return BatchProfile.from_exit_layers(layers, model.num_layers), layers


@dataclass(frozen=True)
class SeriesForecast:
    """Windows of a drifting mix: each window's measured profile, the ARIMA forecast made before it, the error."""
    easy: tuple[float, ...]                  # the easy share of each window
    measured: tuple[BatchProfile, ...]
    forecast: tuple[BatchProfile | None, ...]   # None before the first window
    mean_abs_error: tuple[float | None, ...]    # per window, mean over ramps of |forecast - measured|
    methods: tuple[str, ...]

    @property
    def overall_error(self) -> float:
        errs = [e for e in self.mean_abs_error if e is not None]
        return float(np.mean(errs)) if errs else float("nan")


def profile_series(record: RampRecord, easy: float, threshold: float, windows: int = 24, window_size: int = 128,
                   drift: float = 0.2, period: int = 12, seed: int = 0, order=(1, 1, 0)) -> SeriesForecast:
    """A workload whose easy share swings by ``drift`` around ``easy`` with ``period`` windows; each window's
    profile is measured from the ramps' outputs and forecast by :class:`BatchProfileEstimator` beforehand."""
    limits.windows.check("windows", windows)
    est = BatchProfileEstimator(record.num_layers, order=order)
    shares, measured, forecasts, errors, methods = [], [], [], [], []
    for w in range(windows):
        share = float(np.clip(easy + drift * np.sin(2 * np.pi * w / period), 0.0, 1.0))
        prof = mix_profile(record, share, threshold, n=window_size, seed=seed * 100_003 + w)
        if w:
            details = est.forecast_details()
            forecasts.append(details.profile)
            errors.append(est.error(prof).mean_abs)
            methods.append("arima" if "arima" in details.methods else details.methods[0])
        else:
            forecasts.append(None)
            errors.append(None)
            methods.append("none")
        est.update(prof)
        shares.append(share)
        measured.append(prof)
    return SeriesForecast(tuple(shares), tuple(measured), tuple(forecasts), tuple(errors), tuple(methods))
