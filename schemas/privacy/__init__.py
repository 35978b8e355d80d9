"""Privacy accounting, pure math: local and shuffled ε (``formulas.py``), the numerical
amplification-by-shuffling bound (``amplification.py``), composition (``composition.py``), and the
privacy ledger's records (``ledger.py``) and what they add up to (``accounting.py``).
"""
