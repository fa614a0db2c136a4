"""A tiny SmolVLM directory written from nothing, with no network: what LeRobot's SmolVLA needs at
`vlm_model_name` to build offline (config, tokenizer, processor), at sizes a laptop runs in seconds.

    python -m user_rl.policies.tiny_smolvlm DIR      # then policy.lerobot: {type: smolvla, **tiny_smolvla_fields(DIR)}

SmolVLA builds its VLM from `vlm_model_name` (`AutoConfig` + `AutoProcessor`, and the weights too
with `load_vlm_weights: true`); the real one is `HuggingFaceTB/SmolVLM2-500M-Video-Instruct` on the
Hub. This directory has SmolVLM's architecture (a SigLIP-style vision encoder, a pixel-shuffle
connector, a Llama text model) at a few hundred thousand parameters, random weights (never
loaded: use `load_vlm_weights: false`), and a word-level tokenizer over a small vocabulary with the
special tokens SmolVLM's processor and SmolVLA read (the fake image token, the global image token,
...). Good for tests and for trying the whole system on a small machine; it has learned nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

PAD, UNK, START, END = "<pad>", "<unk>", "<|im_start|>", "<end_of_utterance>"
IMAGE_TOKENS = {  # the tokenizer attributes SmolVLM's processor reads, and the tokens they name
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": END,
}
WORDS = (  # the reach task's instructions, and a few more words of robot tasks; any other word is <unk>
    "move the fingertip to red green blue yellow target touch names instruction pick place put "
    "up down left right cube block cup box into on in of a and grasp push open close drawer"
).split()


def tokenizer_vocabulary(words: tuple[str, ...] | list[str] = WORDS) -> dict[str, int]:
    specials = [PAD, UNK, START, *dict.fromkeys(IMAGE_TOKENS.values()), "<video>"]
    return {token: i for i, token in enumerate(dict.fromkeys([*specials, *(w.lower() for w in words)]))}


def write_tiny_smolvlm(
    path: str | Path,
    image_size: int = 64,
    patch_size: int = 16,
    hidden: int = 64,
    layers: int = 2,
    words: tuple[str, ...] | list[str] = WORDS,
) -> Path:
    """Write a tiny SmolVLM (config, tokenizer, processor: no weights) to `path`; return it.

    Images of `image_size` pixels a side, in patches of `patch_size`: (image_size / patch_size)^2
    patches, 4 to a token after the connector's pixel shuffle. The text model has `hidden` features
    and `layers` layers (SmolVLA uses its first `num_vlm_layers`)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    if image_size % (2 * patch_size):
        raise ValueError(f"image_size {image_size} must be a multiple of 2 x patch_size ({2 * patch_size})")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocabulary = tokenizer_vocabulary(words)
    words_only = Tokenizer(models.WordLevel(vocabulary, unk_token=UNK))
    words_only.normalizer = normalizers.Lowercase()
    words_only.pre_tokenizer = pre_tokenizers.Whitespace()
    # every text starts with <|im_start|>, so even an empty task is one token
    words_only.post_processor = processors.TemplateProcessing(
        single=f"{START} $A", pair=f"{START} $A $B", special_tokens=[(START, vocabulary[START])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words_only,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=START,
        eos_token=END,
        extra_special_tokens=IMAGE_TOKENS,
        model_max_length=1024,
    )
    tokens_per_image = (image_size // patch_size // 2) ** 2
    sizes = {"size": {"longest_edge": image_size}, "max_image_size": {"longest_edge": image_size}}
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(do_image_splitting=False, **sizes),
        tokenizer=tokenizer,
        video_processor=SmolVLMVideoProcessor(**sizes),
        image_seq_len=tokens_per_image,
    )
    heads = max(1, hidden // 16)
    config = SmolVLMConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": patch_size,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": len(vocabulary),
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2),
            "head_dim": hidden // heads,
            "max_position_embeddings": 512,
            "pad_token_id": vocabulary[PAD],
        },
        scale_factor=2,
        image_token_id=vocabulary[IMAGE_TOKENS["image_token"]],
        pad_token_id=vocabulary[PAD],
    )
    config.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def tiny_smolvla_fields(vlm_dir: str | Path, image_size: int = 64) -> dict[str, Any]:
    """SmolVLA config fields (`policy.lerobot`) for a tiny SmolVLA on the VLM `write_tiny_smolvlm` wrote."""
    return {
        "vlm_model_name": str(vlm_dir),
        "load_vlm_weights": False,
        "num_vlm_layers": 2,
        "num_expert_layers": -1,
        "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75,
        "max_state_dim": 32,
        "max_action_dim": 8,
        "resize_imgs_with_padding": [image_size, image_size],
        "tokenizer_max_length": 16,
        "num_steps": 3,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m user_rl.policies.tiny_smolvlm DIR")
    print(write_tiny_smolvlm(sys.argv[1]))
