"""Tiny random-weight models for the tests that run the real vLLM on the npu
(test_vllm_*.py): a Llama saved to a folder with a word-level tokenizer
built here (nothing downloaded), and transformers' greedy generate() on the
CPU in float64 as the reference.

Greedy decoding is compared token for token up to the first step whose
reference logits have a near-tie: where the float64 reference's best two
logits lie closer than the float32 computation's error can reach, either
token is a right answer, and the two runs may rightly part there."""
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tiny_models import llama_config

WORDS = [f"w{i}" for i in range(250)]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
VOCAB = len(SPECIAL) + len(WORDS)
BOS, EOS = 2, 3
# Near-tie bound (logit units) for the float32 runs: the tiny model's logits
# are O(1) sums of O(100) products whose float32 rounding stays below 1e-5
# on any summation order; 1e-3 leaves two orders of magnitude.
TIE = 1e-3


def tokenizer():
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    t = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                             bos_token="[BOS]", eos_token="[EOS]")
    t.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                       "{% if add_generation_prompt %}w0{% endif %}")
    return t


def save_llama(path, num_kv_heads=2, max_positions=1024):
    """A 2-layer Llama (hidden 64, 4 heads of 16, `num_kv_heads` KV heads)
    with its tokenizer in `path`; returns the path."""
    torch.manual_seed(0)
    config = llama_config(vocab_size=VOCAB, num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
                          initializer_range=0.1, pad_token_id=0, bos_token_id=BOS, eos_token_id=EOS)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return str(path)


def random_prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[BOS] + torch.randint(len(SPECIAL), VOCAB, (n - 1, ), generator=g).tolist() for n in lengths]


class Reference:
    """transformers' greedy generate() of the saved model on the CPU in
    float64: the tokens and each step's margin (best minus second-best
    logit)."""

    def __init__(self, path):
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
        self._cache = {}

    def greedy(self, prompt, max_new_tokens):
        key = (tuple(prompt), max_new_tokens)
        if key not in self._cache:
            with torch.no_grad():
                out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                          pad_token_id=0, eos_token_id=EOS, output_scores=True,
                                          return_dict_in_generate=True)
            top2 = [s[0].topk(2).values for s in out.scores]
            self._cache[key] = (out.sequences[0, len(prompt):].tolist(), [float(t[0] - t[1]) for t in top2])
        return self._cache[key]

    def assert_greedy(self, got, prompt, max_new_tokens, what=""):
        """`got` (token ids) equals the reference up to its first near-tie."""
        expected, margins = self.greedy(prompt, max_new_tokens)
        n = next((i for i, m in enumerate(margins) if m < TIE), len(expected))
        assert list(got[:n]) == expected[:n], (f"{what} prompt of {len(prompt)} tokens: {list(got)} != the float64 "
                                               f"reference's {expected} (near-ties from step {n})")
        return n
