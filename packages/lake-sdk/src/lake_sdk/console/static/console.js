// Lake console: Ctrl/Cmd+Enter runs the SQL editor's statement. Nothing else needs script.
document.addEventListener("keydown", function (event) {
  var input = document.querySelector("[data-testid=sql-input]");
  if (input && event.target === input && event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    input.form.submit();
  }
});
