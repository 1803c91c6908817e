"""Classification scores: accuracy, macro-F1 and the confusion matrix, as numbers, a text table and a PNG.

    confusion[i][j] = how many examples of true class i were predicted as class j   (rows: truth, columns: guess)
    F1 of a class   = 2 precision recall / (precision + recall), 0 when the class is never right
    macro-F1        = the unweighted mean of the classes' F1 over the classes that occur (in truth or guess),
                      so a rare class counts as much as a common one (scikit-learn's f1_score(average="macro"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnkit.errors import InputError
from attnkit.outputs import write_figure


def confusion_matrix(truth: Sequence[int], predicted: Sequence[int], n_classes: int) -> list[list[int]]:
    """(n_classes, n_classes) counts; see the module docstring. Raises InputError for unequal lengths or bad ids."""
    if len(truth) != len(predicted):
        raise InputError(f"{len(truth)} true labels but {len(predicted)} predictions")
    matrix = [[0] * n_classes for _ in range(n_classes)]
    for t, p in zip(truth, predicted, strict=True):
        if not (0 <= t < n_classes and 0 <= p < n_classes):
            raise InputError(f"class ids must lie in [0, {n_classes}); got true {t}, predicted {p}")
        matrix[t][p] += 1
    return matrix


def classification_scores(matrix: list[list[int]]) -> dict[str, float]:
    """Accuracy, macro-F1 and the number of examples, from a confusion matrix."""
    n = len(matrix)
    total = sum(map(sum, matrix))
    if total == 0:
        raise InputError("no examples to score")
    correct = sum(matrix[i][i] for i in range(n))
    f1s = []
    for c in range(n):
        true_count = sum(matrix[c])
        guessed = sum(row[c] for row in matrix)
        if true_count == 0 and guessed == 0:
            continue  # a class that occurs nowhere takes no part in the average
        f1s.append(2 * matrix[c][c] / (true_count + guessed))  # = 2PR / (P + R)
    return {"examples": total, "accuracy": correct / total, "macro_f1": sum(f1s) / len(f1s)}


def confusion_table(matrix: list[list[int]], labels: Sequence[str]) -> str:
    """The matrix as aligned text: one row per true label, one column per predicted label."""
    header = ["true \\ predicted", *labels]
    rows = [header, *([label, *map(str, row)] for label, row in zip(labels, matrix, strict=True))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in
                               enumerate(zip(row, widths, strict=True))).rstrip() for row in rows)


def plot_confusion(matrix: list[list[int]], labels: Sequence[str], path: str | Path, *, title: str = "") -> None:
    """The matrix as a PNG heat map with the counts written in, rows normalised for the colour (recall per
    class), written atomically to `path`."""
    from matplotlib.figure import Figure  # here, not at import: every command that loads a task would pay for it

    n = len(matrix)
    shares = [[count / max(sum(row), 1) for count in row] for row in matrix]
    size = min(max(3.0 + 0.5 * n, 4.0), 14.0)
    fig = Figure(figsize=(size + 1.0, size), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="share of the true class")
    ax.set_xticks(range(n), labels=list(labels), rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center",
                  parse_math=False)  # labels and names from the data drawn as written, never as mathtext
    ax.set_yticks(range(n), labels=list(labels), parse_math=False)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    if n <= 30:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(matrix[i][j]), ha="center", va="center",
                        color="white" if shares[i][j] > 0.5 else "black")
    ax.set_title(title, parse_math=False)
    fig.tight_layout()
    write_figure(fig, path)
