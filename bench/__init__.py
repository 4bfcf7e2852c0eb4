"""`make bench`: performance figures against baselines measured in the same run.

    python -m bench            # everything, prints tables, writes bench/results.json
    python -m bench --quick    # smaller inputs, for a smoke run
"""
