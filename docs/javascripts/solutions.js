// The tutorials' solutions, folded: every run of consecutive notebook cells tagged "solution" (code and text alike;
// mkdocs-jupyter marks them with the class celltag_solution) goes into one collapsed "Solution" block, drawn as the
// site draws a collapsed admonition (`??? success "Solution"`). Jupyter collapses the same cells by their
// metadata (jupyter.source_hidden). Without scripts the solutions show, unfolded.
// A code cell is two nested .jp-Cell divs (mkdocs-jupyter's around nbconvert's), both tagged: the outer one is the cell.
function outerCell(element) {
  let cell = element.closest(".jp-Cell");
  for (let up = cell && cell.parentElement.closest(".jp-Cell"); up; up = up.parentElement.closest(".jp-Cell")) {
    cell = up;
  }
  return cell;
}

document.addEventListener("DOMContentLoaded", () => {
  const cells = new Set([...document.querySelectorAll(".celltag_solution")].map(outerCell));
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
