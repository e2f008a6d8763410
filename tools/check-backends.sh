#!/bin/sh
# A backend supplies buffers, slots, checkpoints and a kernel table; the
# layers' sequence of kernel calls is src/model's (runner.c and the
# templates), and what a family is, src/model/family.c's. So the backends
# name no architecture, read no family flag of the configuration and make no
# allocation of their own for mixture-of-experts layers (a template's state
# comes through mt_runner_state_bytes). Prints each line that breaks this;
# fails if any. The kernels (src/cpu/cpu_*.c other than the backend,
# cuda/kernels/) may implement what a family needs: they are not checked.
cd "$(dirname "$0")/.." || exit 2
files="src/cpu/cpu_backend.c cuda/backend/backend.cu"
bad=0
check() { # what, extended regex, grep flags
  hits=$(grep -nE $3 "$2" $files)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s/\$/   <- $1/"
    bad=1
  fi
}
check "an architecture" 'MT_ARCH_|[^a-z_]arch[^a-z_]|mt_family_|family\.h' ''
check "a family's name" '\b(llama|mistral|mixtral|qwen[0-9]*|gemma[0-9]*|phi-?[0-9]+|olmo[0-9]*|deepseek|gpt-?oss|granite|cohere)\b' -i
check "a family flag of the configuration" \
  'qk_norm|norm_offset|hidden_act|glu_act|embed_scale|query_pre_attn_scalar|logit_softcapping|sliding_window|num_experts|moe_intermediate|router_aux|partial_rotary|rope_scaling|attention_bias|mt_config_is_' ''
check "mixture-of-experts state the backend allocates" 'moe_stats|moe_offs|->moe\b|\.moe\b|MT_MOE_' ''
[ $bad = 0 ] && echo "backends free of family code: ok"
exit $bad
