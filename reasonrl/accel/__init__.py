"""CPU acceleration, behind two entry points: `decoder` for generation, `TrainingAccel` (and
the `recompute_norm_outputs` context around a training forward) for the update. Nothing
outside this subpackage names MKL, glibc or transformers internals.

Each entry point has its switch (`rollout.hf_decoder`, `optim.lean_kernels`) and a plain
fallback that runs everywhere: the transformers modules for decoding, torch's own kernels
and tensors for training. The fast paths are worth keeping (they halve the CPU step on the
first machine measured) but not trusted blindly: `rollout.hf_decoder=auto` measures the
decoders on the run's own shapes and keeps the fastest (`calibrate`).

A transformers upgrade breaks at most this subpackage; its tests are tests/accel/test_accel.py.
"""

from reasonrl.accel.calibrate import choose
from reasonrl.accel.decode import DECODERS, KV_REUSE, CachingDecoder, Decoder, decoder, unavailable
from reasonrl.accel.kernels import recompute_norm_outputs
from reasonrl.accel.memory import release_free_memory
from reasonrl.accel.training import TrainingAccel, fused_adam_ok

__all__ = ["DECODERS", "KV_REUSE", "CachingDecoder", "Decoder", "TrainingAccel", "choose", "decoder",
           "fused_adam_ok", "recompute_norm_outputs", "release_free_memory", "unavailable"]
