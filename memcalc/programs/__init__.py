"""Forward programs per implementation: the ops each model's code runs, in order."""
