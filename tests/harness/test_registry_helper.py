"""The one Registry every plug-in kind uses (harness/core/registry.py): one owner per name, did-you-mean,
built-ins imported on first use, and the plugin loader's error."""

from __future__ import annotations

import pytest

from harness.core.registry import Registry, import_plugins


def first():
    pass


def second():
    pass


def test_one_owner_per_name_and_the_same_object_again_is_accepted():
    registry: Registry = Registry("widget")
    registry.add("a", first)
    registry.add("a", first)  # a module imported twice registers the same object again
    with pytest.raises(ValueError, match=r"widget 'a' is already registered by (tests\.harness\.)?test_registry_helper\.first"):
        registry.add("a", second)
    assert registry.get("a") is first


def test_an_unknown_name_names_the_nearest_the_registered_and_the_fix():
    registry: Registry = Registry("widget", setting="thing.kind", how_to_add="Register yours with @widget")
    registry.add("alpha", first)
    registry.add("beta", second)
    with pytest.raises(KeyError, match=r"thing.kind='alpah' is unknown \(did you mean 'alpha'\?\); registered: alpha, "
                                       r"beta\. Register yours with @widget"):
        registry.get("alpah")
    assert registry.names() == ["alpha", "beta"] and "beta" in registry and "gamma" not in registry


def test_builtin_modules_are_imported_on_first_use_and_a_missing_one_is_skipped(tmp_path, monkeypatch):
    # a module named but absent is skipped; a module that fails inside (a missing dependency) is not
    (tmp_path / "registers_one.py").write_text("import registry_under_test\nregistry_under_test.REGISTRY.add('one', print)\n")
    (tmp_path / "broken_inside.py").write_text("import a_dependency_that_is_not_installed\n")
    (tmp_path / "registry_under_test.py").write_text(
        "from harness.core.registry import Registry\n"
        "REGISTRY = Registry('widget', builtin_modules=('no_such_module', 'registers_one'), optional_builtins=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import registry_under_test

    assert registry_under_test.REGISTRY.names() == ["one"]  # imported on first use; the absent module did not raise
    broken: Registry = Registry("widget", builtin_modules=("broken_inside",))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        broken.names()
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        broken.names()  # not marked loaded after a failure: the real error again, never a silent empty registry
    strict: Registry = Registry("widget", builtin_modules=("no_such_module",))
    with pytest.raises(ModuleNotFoundError):
        strict.names()  # only a registry that says so (algorithms) skips a built-in module that is not there


def test_a_spec_registry_compares_the_function_it_holds():
    class Spec:
        def __init__(self, fn):
            self.fn = fn

    registry: Registry = Registry("backend", owner=lambda spec: spec.fn)
    registry.add("x", Spec(first))
    registry.add("x", Spec(first))  # a new spec of the same function: the same owner
    with pytest.raises(ValueError, match=r"already registered by (tests\.harness\.)?test_registry_helper\.first"):
        registry.add("x", Spec(second))


def test_a_plugin_that_cannot_be_imported_is_named_with_the_fix():
    with pytest.raises(ImportError, match=r"plugins: cannot import 'no_such_pkg\.mod'.*importable module"):
        import_plugins(["no_such_pkg.mod"])
