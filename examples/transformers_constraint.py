"""Use a leapgen constraint inside plain `transformers` generate() through a LogitsProcessor.

    python examples/transformers_constraint.py
"""

from transformers import AutoModelForCausalLM

from leapgen.decoding import GrammarLogitsProcessor
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.engine.loader import load_tokenizer
from leapgen.grammars import compile_regex

directory = convert_gguf(default_model_path())            # the default model as an HF checkpoint directory
tokenizer = load_tokenizer(directory)
model = AutoModelForCausalLM.from_pretrained(directory)

grammar = compile_regex(r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", tokenizer)
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "When did the Berlin Wall fall?"}],
                                       tokenize=False, add_generation_prompt=True)
inputs = tokenizer(prompt, return_tensors="pt")
# the same budget as generate's: the date then completes within it, however the model would have gone on
processor = GrammarLogitsProcessor(grammar, eos_token_id=tokenizer.eos_token_id, max_new_tokens=12)
out = model.generate(**inputs, max_new_tokens=12, do_sample=False, logits_processor=[processor])
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
