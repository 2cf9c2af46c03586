"""Never imported: mypy (CI, strict) checks that the core's defaults satisfy the factory Protocols.

A change to a default's signature that a spec's replacement could no longer mirror fails
type checking here, not in a plugin author's run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..data import build_dataloader
    from ..data.loader import TokenDataLoader
    from ..data.tokenizer import TiktokenTokenizer
    from ..hf.tokenizer_folder import HFTokenizersTokenizer
    from ..models.loss import cross_entropy_loss
    from ..observability.metrics import MetricsLogger
    from ..optim.containers import LRSchedulersContainer, OptimizersContainer
    from ..parallel import default_parallelize_fn
    from ..plugin.spec_factories import (
        BatchEncoder,
        BuildDataloaderFn,
        BuildLRSchedulersFn,
        BuildMetricsProcessorFn,
        BuildOptimizersFn,
        DataLoader,
        Fingerprinted,
        LossFn,
        LRSchedulers,
        MetricsProcessor,
        ParallelizeFn,
        Tokenizer,
    )
    from .tiny_spec import TINY_SPEC

    _optimizers: BuildOptimizersFn = OptimizersContainer
    _lr: BuildLRSchedulersFn = LRSchedulersContainer
    _metrics: BuildMetricsProcessorFn = MetricsLogger
    _loader: BuildDataloaderFn = build_dataloader
    _loss: LossFn = cross_entropy_loss
    _parallelize: ParallelizeFn = default_parallelize_fn(TINY_SPEC.tp_plan_fn)

    def _results(a: TokenDataLoader, b: LRSchedulersContainer, c: MetricsLogger) -> None:
        _a: DataLoader = a
        _b: LRSchedulers = b
        _c: MetricsProcessor = c

    def _tokenizers(a: TiktokenTokenizer, b: HFTokenizersTokenizer) -> None:
        _a: Tokenizer = a
        _b: Tokenizer = b
        _a_batch: BatchEncoder = a
        _b_batch: BatchEncoder = b
        _a_fingerprint: Fingerprinted = a

    # ModelConverter[X] types self.config as X (a plugin reads its fields without a cast).
    from pydantic import BaseModel

    from ..plugin.protocols import ModelConverter

    class _Config(BaseModel):
        bits: int

    class _Converter(ModelConverter[_Config]):
        def bits(self) -> int:
            return self.config.bits
