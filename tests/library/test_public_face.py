"""The package's public face (spgc/__init__.py): the modules that sat at spgc/'s top level
until 0.1.0 still import under their old names, as the moved module itself, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import spgc
from spgc.learning import models
from spgc.privacy import noise


def test_every_moved_module_lives_at_its_new_name() -> None:
    assert len(spgc.MOVED) == 30
    for old, new in spgc.MOVED.items():
        module = importlib.import_module(new)
        assert module.__name__ == new
        assert old.rsplit(".", 1)[1] == new.rsplit(".", 1)[1]


def test_an_old_name_gives_the_moved_module_and_a_deprecation_warning() -> None:
    # A fresh interpreter: in this one the old names may have been imported already.
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import spgc.models\nexcept DeprecationWarning as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "spgc.models moved to spgc.learning.models; the old name goes in the next release"
    )


def test_the_alias_is_the_same_module_object() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("spgc.models")
        from spgc.noise import sample_noise_plain  # the old spelling users wrote

    assert old is models
    assert sample_noise_plain is noise.sample_noise_plain
    assert spgc.noise is noise  # as an attribute of the package too


def test_a_name_that_never_existed_still_fails() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spgc.no_such_module")
    with pytest.raises(AttributeError, match="no_such_module"):
        _ = spgc.no_such_module
