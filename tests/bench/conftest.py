"""GPU kernel benchmarks as ordinary tests (replaybench's gpu_benchmark fixture).

The fixture comes from the package's pytest plugin (entry point pytest11 `replaybench`); a
checkout used without installing the package registers the same plugin here.
"""


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("replaybench"):
        from replaybench import pytest_plugin
        config.pluginmanager.register(pytest_plugin, "replaybench")
