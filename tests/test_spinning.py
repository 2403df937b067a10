"""``CROSSKNN_ORT_SPINNING``: ONNX Runtime's intra-op spin-waiting as the environment asks
(crossknn.ce.spinning), on the sessions crossknn opens."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from crossknn.ce.spinning import ENV, set_spinning

KEY = "session.intra_op.allow_spinning"


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_environment_sets_the_session_entry(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    so = ort.SessionOptions()
    set_spinning(so)
    assert so.get_session_config_entry(KEY) == value


def test_unset_keeps_onnx_runtimes_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    so = ort.SessionOptions()
    set_spinning(so)
    with pytest.raises(Exception, match="allow_spinning|not found|does not exist"):
        so.get_session_config_entry(KEY)


def test_a_bad_value_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(ENV, "no")
    with pytest.raises(ValueError, match=r"CROSSKNN_ORT_SPINNING must be 0 or 1; got 'no'"):
        set_spinning(ort.SessionOptions())


def test_the_cross_encoder_session_takes_it(monkeypatch, model_cache):
    from crossknn.ce import default_cross_encoder

    monkeypatch.setenv(ENV, "0")
    ce = default_cross_encoder(cache_dir=model_cache, threads=1)
    a = ce.predict([("parse a date", "time.strptime parses a string")])
    monkeypatch.setenv(ENV, "1")
    b = default_cross_encoder(cache_dir=model_cache, threads=1).predict(
        [("parse a date", "time.strptime parses a string")]
    )
    assert a.tolist() == b.tolist()  # the scores do not depend on it
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(ValueError, match="CROSSKNN_ORT_SPINNING must be 0 or 1"):
        default_cross_encoder(cache_dir=model_cache, threads=1)
