"""Translation scores: corpus BLEU on two protocols and chrF, each with sacreBLEU's signature (Post 2018), so a
number says exactly how it was computed. Used by the translate task's validation and by `attnkit eval`.
"""

from __future__ import annotations

from typing import Any

from attnkit.errors import InputError


def bleu_scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Corpus BLEU on two protocols, with sacreBLEU's signatures (which say exactly how each was computed):

        bleu             sacreBLEU's defaults: cased, detokenized text, 13a tokenization (the standard to report)
        bleu_lowercased  the published Multi30k protocol (lowercased, tokenized text: spaCy tokens scored with
                         torchtext's BLEU, e.g. the small Transformer's 36.5): sacreBLEU with lowercase=True, whose
                         13a tokenizer splits punctuation as spaCy does on these captions

    References without a space anywhere (a character task: reversing or copying strings) are scored on characters
    (sacreBLEU's "char" tokenizer, `tok:char` in the signature): on words each line would be a single word, with no
    n-grams to match, and BLEU 0 even for a model that is almost always right.
    """
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise InputError(f"{len(hypotheses)} translations for {len(references)} references")
    tokenize = "char" if references and not any(" " in reference.strip() for reference in references) else "13a"
    scores: dict[str, Any] = {}
    metrics = {"bleu": BLEU(tokenize=tokenize), "bleu_lowercased": BLEU(lowercase=True, tokenize=tokenize)}
    for name, metric in metrics.items():
        scores[name] = metric.corpus_score(hypotheses, [references]).score
        scores[f"{name}_signature"] = str(metric.get_signature())
    return scores


def translation_scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """`bleu_scores` and sacreBLEU's chrF (defaults), each with its signature."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    return {**bleu_scores(hypotheses, references), "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "chrf_signature": str(chrf.get_signature())}
