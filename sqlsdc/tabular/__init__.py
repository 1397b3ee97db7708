"""Table protection on aggregated cells: the table model, primary rules, secondary suppression and
its audit (issue 5), usable on pandas data without a database and from the guarded query path."""
