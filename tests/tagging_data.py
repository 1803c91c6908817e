"""A synthetic named-entity set whose entities can be learned from the text alone: people, places and companies
drawn from closed lists (some of two or three words), in a few sentence templates, tagged in BIO."""

from __future__ import annotations

import random

PEOPLE = ["Anna", "Ben", "Carla Diaz", "Dev Patel", "Ema", "Farid", "Greta Lind", "Hugo", "Ines Moreau", "Jon"]
PLACES = ["Paris", "Oslo", "New York", "Lima", "Rio de Janeiro", "Kyoto", "Cairo", "San Jose"]
COMPANIES = ["Acme Corp", "Globex", "Initech Labs", "Umbrella", "Stark Industries", "Hooli"]
TEMPLATES = [
    "{PER} lives in {LOC} .",
    "{PER} works for {ORG} in {LOC} .",
    "yesterday {PER} met {PER} at the station .",
    "the {ORG} office in {LOC} is closed today .",
    "{ORG} hired {PER} last year .",
    "we flew from {LOC} to {LOC} on monday .",
]
NAMES = {"PER": PEOPLE, "LOC": PLACES, "ORG": COMPANIES}


def tagging_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """`n` sentences as (words, BIO tags), a pure function of the arguments."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words, tags = [], []
        for piece in rng.choice(TEMPLATES).split():
            if piece.startswith("{"):
                kind = piece[1:-1]
                entity = rng.choice(NAMES[kind]).split()
                words += entity
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
            else:
                words.append(piece)
                tags.append("O")
        sentences.append((words, tags))
    return sentences
