"""What the tests share, in one package (tests import from here, never from conftest or from
each other; the local stand-ins of clouds and workers are the top-level `testbed` package):

    paths      REPO, the bundled corpus, the other Pythons (.venv-torch) and the scripts they run
    corpora    small corpora cut from the bundled text
    configs    run configs: the tiny launcher one, the stage one, the training one
    runners    the payload and the CLI, in this process or as a user runs them; one-line errors
    runs       prepared and trained output folders, made once per session and copied per test
    golden     recorded loss curves of deterministic tiny runs, compared within a tolerance
    cloud      the cloud stand-ins wired to the launcher: storage emulator, fleet-backed clouds
    waits      polling with a deadline
    guard      the fast tier's guard (no process, no ML framework)
    environment  the suite's environment: what a user exports for the tools under test, dropped
    scripts/   programs run in other Pythons (PyTorch 5.x checks, JAX worker processes)
"""
