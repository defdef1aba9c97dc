"""User tools behind `eagle-zoo diagnose`, `eagle-zoo vocab-coverage` and `eagle-zoo openers`."""
