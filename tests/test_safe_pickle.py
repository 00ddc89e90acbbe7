"""The restricted unpickler refuses pickles that would run code (and runs none of it), loads plain ones in
every layout a TransfoXL vocab.pkl comes in, and the Hugging Face vocabulary becomes a txl word vocabulary
with the same ids."""

from __future__ import annotations

import collections
import json
import os
import pickle

import pytest
import torch

from txl.data.vocab import WordVocab, load_vocab
from txl.interop import CheckpointError, load_hf_vocab
from txl.interop.safe_pickle import UnsafePickleError, safe_load_file, safe_loads


class _Exploit:
    """Unpickling this runs a shell command that creates a file (the attack a pickled vocabulary allows)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Plain:
    """An ordinary object: still refused (only containers, strings and numbers are built)."""


def _hf_vocab_dict(symbols: list[str]) -> dict:
    """What TransfoXLTokenizer / the authors' Vocab pickle: their ``__dict__`` of plain containers."""
    counter = collections.Counter({s: 100 - i for i, s in enumerate(symbols)})
    return {
        "special": ["<eos>"],
        "min_freq": 0,
        "max_size": None,
        "lower_case": False,
        "delimiter": None,
        "vocab_file": None,
        "never_split": None,
        "counter": counter,
        "idx2sym": list(symbols),
        "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(symbols)),
        "eos_idx": 0,
        "unk_idx": symbols.index("<unk>"),
    }


SYMBOLS = ["<eos>", "the", ",", ".", "of", "<unk>", "and", "in", "Valkyria", "=", "@-@", "é"]


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickle_is_refused_and_not_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"idx2sym": ["a"], "x": _Exploit(str(marker))}, protocol=protocol)
    with pytest.raises(UnsafePickleError, match=r"refers to (posix|os)\.system.*refused without running it"):
        safe_loads(data)
    assert not marker.exists()
    path = tmp_path / "vocab.pkl"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="vocab.pkl.*system.*vocab.txt"):
        load_hf_vocab(path)
    assert not marker.exists()


def test_the_exploit_is_real(tmp_path):
    """The same bytes do run the command under the ordinary unpickler (so the test above means something)."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Exploit(str(marker))))
    assert marker.exists()


def test_other_globals_and_tensors_are_refused(tmp_path):
    with pytest.raises(UnsafePickleError, match="builtins.eval"):
        safe_loads(b"cbuiltins\neval\n(S'1+1'\ntR.")
    with pytest.raises(UnsafePickleError, match="_Plain"):  # any class, even a harmless one
        safe_loads(pickle.dumps([_Plain()]))
    with pytest.raises(UnsafePickleError, match="not a readable pickle"):
        safe_loads(b"not a pickle")
    path = tmp_path / "t.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(UnsafePickleError, match="tensors|torch"):
        safe_load_file(path)


@pytest.mark.parametrize(
    "layout", ["pickle protocol 2", "pickle protocol 5", "torch.save legacy", "torch.save zip"]
)
def test_plain_vocab_pickles_load(tmp_path, layout):
    data = _hf_vocab_dict(SYMBOLS)
    path = tmp_path / "vocab.pkl"
    if layout.startswith("pickle"):
        path.write_bytes(pickle.dumps(data, protocol=int(layout[-1])))
    else:
        torch.save(data, path, _use_new_zipfile_serialization=layout.endswith("zip"))
    loaded = safe_load_file(path)
    assert loaded == data
    assert isinstance(loaded["counter"], collections.Counter) and isinstance(
        loaded["sym2idx"], collections.OrderedDict
    )


def test_hf_vocab_becomes_a_word_vocab_with_the_same_ids(tmp_path):
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(_hf_vocab_dict(SYMBOLS), protocol=2))
    vocab = load_hf_vocab(tmp_path)
    assert isinstance(vocab, WordVocab) and list(vocab.symbols) == SYMBOLS
    assert (vocab.eos_id, vocab.unk_id) == (0, 5)
    ids = vocab.encode("the Valkyria of zzz\n= é =\n")
    assert ids.tolist() == [1, 8, 4, 5, 0, 9, 11, 9, 0]  # unknown word -> <unk> (5), <eos> (0) per line
    assert vocab.decode(ids) == "the Valkyria of <unk>\n= é =\n"
    vocab.save(tmp_path / "vocab.json")  # the JSON round trip keeps the order
    again = load_vocab(tmp_path / "vocab.json")
    assert list(again.symbols) == SYMBOLS and again.unk_id == 5 and again.fingerprint == vocab.fingerprint
    # an ordinary word vocabulary's JSON (and fingerprint) is unchanged: no "as_given" key
    assert "as_given" not in WordVocab(["a"]).to_dict()


def test_vocab_txt_and_json_exports(tmp_path):
    (tmp_path / "vocab.txt").write_text(
        "".join(f"{s} {100 - i}\n" for i, s in enumerate(SYMBOLS)), encoding="utf-8"
    )
    assert list(load_hf_vocab(tmp_path / "vocab.txt").symbols) == SYMBOLS
    (tmp_path / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(SYMBOLS)}), encoding="utf-8")
    assert list(load_hf_vocab(tmp_path / "vocab.json").symbols) == SYMBOLS
    no_unk = load_hf_vocab_from_list(tmp_path, ["<eos>", "a", "b"])
    assert no_unk.unk_id is None
    with pytest.raises(ValueError, match="not in the word vocabulary"):
        no_unk.encode("a c")


def load_hf_vocab_from_list(folder, symbols):
    path = folder / "list.json"
    path.write_text(json.dumps(symbols), encoding="utf-8")
    return load_hf_vocab(path)


def test_unsupported_vocab_settings_are_refused(tmp_path):
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps({**_hf_vocab_dict(SYMBOLS), "lower_case": True}))
    with pytest.raises(CheckpointError, match="lower_case"):
        load_hf_vocab(path)
    path.write_bytes(pickle.dumps(["not", "a", "dict"]))
    with pytest.raises(CheckpointError, match="expected the pickled dict"):
        load_hf_vocab(path)
