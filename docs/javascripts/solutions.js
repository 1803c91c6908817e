// The tutorials' solutions, folded: every run of consecutive notebook cells tagged "solution" (code and text alike;
// mkdocs-jupyter marks them with the class celltag_solution) goes into one collapsed "Solution" block, drawn as the
// site draws a collapsed admonition (`??? success "Solution"`). Jupyter collapses the same cells by their
// metadata (jupyter.source_hidden). Without scripts the solutions show, unfolded.
document.addEventListener("DOMContentLoaded", () => {
  const cells = new Set([...document.querySelectorAll(".celltag_solution")].map((el) => el.closest(".jp-Cell")));
  for (const cell of cells) {
    if (!cell) continue;
    const before = cell.previousElementSibling;
    if (before && before.matches("details.attnkit-solution")) {
      before.appendChild(cell);
      continue;
    }
    const details = document.createElement("details");
    details.className = "success attnkit-solution";
    const summary = document.createElement("summary");
    summary.textContent = "Solution";
    details.appendChild(summary);
    cell.replaceWith(details);
    details.appendChild(cell);
  }
});
