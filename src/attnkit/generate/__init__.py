"""Using a trained model: generation (decoder), translation (encoder-decoder), classification (encoder).

`load(run_dir)` returns a `Pipeline` with its run's method: `.generate`, `.translate`, `.classify` (a `Classification`
a text) or `.reward` (a `Reward` a text); the token-level functions below it work on any model of the right family.
`best_of_n(policy, reward, prompts, n=N)` keeps the best of N samples as a reward run scores them.
"""

from attnkit.generate.beam import beam_generate, beam_search, translate_batched, translate_ids
from attnkit.generate.constrained import Grammar, GrammarMask
from attnkit.generate.decoder import (
    EagerDecoding,
    decode_n_tokens,
    decode_one_token,
    generate_tokens,
    left_pad,
    prefill,
)
from attnkit.generate.pipeline import Classification, Pipeline, load, sample_after_training
from attnkit.generate.sampling import GREEDY, SamplingConfig, make_generator, select_next
from attnkit.generate.seq2seq import encode_sources, greedy_translate
from attnkit.generate.static_decode import StaticDecoding
from attnkit.tasks.best_of import BestOfN, best_of_n
from attnkit.tasks.reward import Reward

__all__ = [
    "GREEDY",
    "BestOfN",
    "Classification",
    "EagerDecoding",
    "Grammar",
    "GrammarMask",
    "Pipeline",
    "Reward",
    "SamplingConfig",
    "StaticDecoding",
    "beam_generate",
    "beam_search",
    "best_of_n",
    "decode_n_tokens",
    "decode_one_token",
    "encode_sources",
    "generate_tokens",
    "greedy_translate",
    "left_pad",
    "load",
    "make_generator",
    "prefill",
    "sample_after_training",
    "select_next",
    "translate_batched",
    "translate_ids",
]
