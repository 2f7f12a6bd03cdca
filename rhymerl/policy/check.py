"""Checks on a Hugging Face model folder that run in well under a second, before any engine starts.

`model_folder_errors` is the structural check (folder, config.json, a causal LM, weights, a
tokenizer) that `rhymerl.policy.build.validate_model_dir` raises from. `model_problems` adds what
otherwise fails only minutes later inside an engine or the trainer: unreadable weight files, a
tokenizer that does not load, an architecture this vLLM does not run, `model.max_model_len` above
the model's positions, a tokenizer larger than the embedding.

Speed is the point (importing `transformers.AutoTokenizer` or vLLM's model registry takes 8-17 s
on a 2-core machine), so: the tokenizer loads with the `tokenizers` library, and the tables of
supported architectures are read from the installed packages' source without importing them.
A table that cannot be read makes its check pass; the engine still checks at start.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Vocabulary files a tokenizer without tokenizer.json loads from (SentencePiece, BPE, WordPiece).
_VOCAB_FILES = ("tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def model_folder_errors(path: str | Path) -> list[Exception]:
    """The folder's structural problems, in the order a user fixes them; [] = a causal-LM folder.

    Each is a FileNotFoundError (something missing) or ValueError (something wrong) whose message
    names the problem and the fix. A missing folder or config.json stops the list there.
    """
    path = Path(path)
    if not path.is_dir():
        return [FileNotFoundError(f"model folder {path} does not exist; set model.path to a local "
                                  "Hugging Face checkpoint folder, or to \"\" for the built-in model")]
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return [FileNotFoundError(f"{path} has no config.json; it is not a Hugging Face model folder "
                                  "(save one with model.save_pretrained(path))")]
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return [ValueError(f"{cfg_file} is not valid JSON: {exc}")]
    if not isinstance(cfg, dict):
        return [ValueError(f"{cfg_file} must hold a JSON object, got {type(cfg).__name__}")]
    errors: list[Exception] = []
    if not is_causal_lm(cfg):
        errors.append(ValueError(f"{cfg_file} describes architectures={cfg.get('architectures')} "
                                 f"model_type={cfg.get('model_type')!r}, not a causal LM; RhymeRL needs a "
                                 "decoder-only model such as *ForCausalLM"))
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        errors.append(FileNotFoundError(f"{path} has no weights (looked for {', '.join(WEIGHT_FILES)})"))
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        errors.append(FileNotFoundError(f"{path} has no tokenizer (tokenizer.json or tokenizer_config.json); "
                                        "save one with tokenizer.save_pretrained(path)"))
    return errors


def model_problems(path: str | Path, max_model_len: int) -> list[str]:
    """Every problem of the model folder at `path` for a run with `model.max_model_len`; [] = fine.

    The structural problems first; then (on a folder with a readable config.json) weights that
    cannot be read, a tokenizer that does not load, an architecture vLLM does not run, and
    lengths and vocabulary sizes the engine would refuse.
    """
    path = Path(path)
    errors = [str(e) for e in model_folder_errors(path)]
    cfg_file = path / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError):
        return errors  # already reported: no folder, no config.json, or not JSON
    if not isinstance(cfg, dict):
        return errors
    errors += _weight_problems(path)
    errors += _architecture_problems(cfg, cfg_file)
    positions = cfg.get("max_position_embeddings")
    # RoPE scaling stretches the positions vLLM accepts; only an unscaled model is judged here.
    if isinstance(positions, int) and not cfg.get("rope_scaling") and max_model_len > positions:
        errors.append(f"model.max_model_len={max_model_len} exceeds the model's max_position_embeddings="
                      f"{positions} ({cfg_file}); set model.max_model_len to at most {positions}")
    errors += _tokenizer_problems(path, cfg.get("vocab_size"))
    return errors


def is_causal_lm(cfg: dict) -> bool:
    """True if a config.json dict describes a decoder-only LM (by architectures, else model_type)."""
    archs = cfg.get("architectures") or []
    if archs:
        return any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    causal = source_mapping("transformers.models.auto.modeling_auto", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    return causal is None or cfg.get("model_type") in causal  # unknown table: let the loader decide


def _weight_problems(path: Path) -> list[str]:
    """Weight files that are empty or unreadable, and shards an index names but the folder lacks."""
    problems = []
    for name in WEIGHT_FILES:
        f = path / name
        if not f.is_file():
            continue
        if f.stat().st_size == 0:
            problems.append(f"weights file {f} is empty; save the model again with model.save_pretrained(path)")
        elif name.endswith(".index.json"):
            problems += _missing_shards(f)
        elif name.endswith(".safetensors"):
            problems += _safetensors_problems(f)
    return problems


def _missing_shards(index_file: Path) -> list[str]:
    try:
        shards = set(json.loads(index_file.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"weights index {index_file} is not a valid index ({type(exc).__name__}: {exc}); "
                "save the model again with model.save_pretrained(path)"]
    missing = sorted(s for s in shards if not (index_file.parent / s).is_file())
    return [f"weights index {index_file} names shards the folder lacks: {', '.join(missing[:5])}; "
            "copy every shard into the folder"] if missing else []


def _safetensors_problems(f: Path) -> list[str]:
    from safetensors import safe_open  # reads the header only

    try:
        with safe_open(str(f), framework="np") as st:
            if not list(st.keys()):
                return [f"weights file {f} holds no tensors; save the model again with model.save_pretrained(path)"]
    except Exception as exc:  # safetensors raises its own SafetensorError (and OSError)
        return [f"weights file {f} is not a readable safetensors file ({exc}); save the model again "
                "with model.save_pretrained(path)"]
    return []


def _architecture_problems(cfg: dict, cfg_file: Path) -> list[str]:
    """Architectures vLLM cannot run: removed ones (with the last version) and unknown ones.

    vLLM runs its own implementations, plus any Transformers causal LM through its Transformers
    backend; only an architecture in neither table is refused here.
    """
    archs = [str(a) for a in cfg.get("architectures") or []]
    vllm_text = supported_vllm_architectures()
    if not archs or vllm_text is None:
        return []
    removed = source_mapping("vllm.model_executor.models.registry", "_PREVIOUSLY_SUPPORTED_MODELS") or {}
    hf_causal = set((source_mapping("transformers.models.auto.modeling_auto",
                                    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES") or {}).values())
    problems = []
    for arch in archs:
        if arch in vllm_text or arch in hf_causal:
            continue
        if arch in removed:
            problems.append(f"{cfg_file}: architecture {arch} was last supported by vLLM {removed[arch]}; "
                            "use a model of a supported architecture (e.g. Qwen2ForCausalLM, LlamaForCausalLM)")
        elif arch.endswith(("ForCausalLM", "LMHeadModel")):
            problems.append(f"{cfg_file}: vLLM does not support architecture {arch}; use a model of a "
                            "supported architecture (e.g. Qwen2ForCausalLM, LlamaForCausalLM)")
    return problems


def _tokenizer_problems(path: Path, vocab_size: object) -> list[str]:
    tok_json = path / "tokenizer.json"
    tok_cfg = path / "tokenizer_config.json"
    problems = []
    if tok_cfg.is_file():
        try:
            json.loads(tok_cfg.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            problems.append(f"{tok_cfg} is not valid JSON ({exc}); save the tokenizer again with "
                            "tokenizer.save_pretrained(path)")
    if tok_json.is_file():
        from tokenizers import Tokenizer  # the Rust loader AutoTokenizer's fast tokenizers use

        try:
            size = Tokenizer.from_file(str(tok_json)).get_vocab_size(with_added_tokens=True)
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            return problems + [f"{tok_json} does not load as a tokenizer ({exc}); save the tokenizer "
                               "again with tokenizer.save_pretrained(path)"]
        if isinstance(vocab_size, int) and size > vocab_size:
            problems.append(f"the tokenizer in {path} has {size} tokens but config.json's vocab_size is "
                            f"{vocab_size}: ids past the embedding would crash the engine; use the "
                            "tokenizer saved with this model")
    elif tok_cfg.is_file() and not any((path / f).is_file() for f in _VOCAB_FILES):
        problems.append(f"{path} has tokenizer_config.json but no tokenizer.json or vocabulary file "
                        f"({', '.join(_VOCAB_FILES)}); save the tokenizer with tokenizer.save_pretrained(path)")
    return problems


def supported_vllm_architectures() -> frozenset[str] | None:
    """Text-generation architectures the installed vLLM implements itself; None if unreadable."""
    own = source_mapping("vllm.model_executor.models.registry", "_TEXT_GENERATION_MODELS")
    via_hf = source_mapping("vllm.model_executor.models.registry", "_TRANSFORMERS_SUPPORTED_MODELS")
    if own is None:
        return None
    return frozenset(own) | frozenset(via_hf or {})


@lru_cache(maxsize=None)
def source_mapping(module: str, name: str) -> dict[str, str] | None:
    """The module-level literal `name = {...}` or `OrderedDict([...])` of `module`, read from its
    source file without importing it (or its package); None when absent or not a literal."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level find_spec runs no package code
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _literal_pairs(node.value)
    return None


def _literal_pairs(value: ast.expr) -> dict[str, str] | None:
    if isinstance(value, ast.Call) and value.args:  # OrderedDict([(k, v), ...])
        value = value.args[0]
    try:
        data = ast.literal_eval(value)
    except ValueError:  # e.g. a dict with **spread entries
        return None
    pairs = data.items() if isinstance(data, dict) else data
    try:
        return {str(k): str(v) for k, v in pairs}
    except (TypeError, ValueError):
        return None
