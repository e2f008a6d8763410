package megatrain

// #include <megatrain.h>
// #include <stdlib.h>
//
// // The library calls C function pointers; these forward to the Go
// // functions exported in callbacks.go. user_data carries a cgo.Handle.
// extern int goMegatrainAbort(uintptr_t handle);
// extern void goMegatrainLog(int level, char *text, uintptr_t handle);
//
// static int mtgo_abort(void *user_data)
// {
//     return goMegatrainAbort((uintptr_t)user_data);
// }
//
// static void mtgo_log(mt_log_level level, const char *text, void *user_data)
// {
//     goMegatrainLog((int)level, (char *)text, (uintptr_t)user_data);
// }
//
// // Done in C so that the handle never passes through an unsafe.Pointer in Go.
// static void mtgo_set_callbacks(mt_offload_policy *pol, uintptr_t log_handle, uintptr_t abort_handle)
// {
//     pol->log_callback = log_handle ? mtgo_log : NULL;
//     pol->log_user_data = (void *)log_handle;
//     pol->abort_callback = abort_handle ? mtgo_abort : NULL;
//     pol->abort_user_data = (void *)abort_handle;
// }
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// Each option struct below mirrors a C struct without its struct_size and
// reserved fields. Its conversion to C starts from the C init function, so
// struct_size is this header's and any field the Go struct lacks keeps the
// library's default.

// Arch is a model architecture (mt_arch).
type Arch uint32

// The architectures.
const (
	ArchLlama      Arch = C.MT_ARCH_LLAMA
	ArchQwen2      Arch = C.MT_ARCH_QWEN2
	ArchMistral    Arch = C.MT_ARCH_MISTRAL
	ArchQwen3      Arch = C.MT_ARCH_QWEN3
	ArchPhi3       Arch = C.MT_ARCH_PHI3
	ArchGemma2     Arch = C.MT_ARCH_GEMMA2
	ArchGemma3     Arch = C.MT_ARCH_GEMMA3
	ArchQwen3Moe   Arch = C.MT_ARCH_QWEN3_MOE
	ArchMixtral    Arch = C.MT_ARCH_MIXTRAL
	ArchQwen2Moe   Arch = C.MT_ARCH_QWEN2_MOE
	ArchGptOss     Arch = C.MT_ARCH_GPT_OSS
	ArchDeepseekV3 Arch = C.MT_ARCH_DEEPSEEK_V3
	ArchDeepseekV2 Arch = C.MT_ARCH_DEEPSEEK_V2
	ArchLlama4     Arch = C.MT_ARCH_LLAMA4
)

// Precision is the numeric mode of a model (mt_precision).
type Precision uint32

// The precisions.
const (
	PrecisionBF16 Precision = C.MT_PRECISION_BF16
	PrecisionFP32 Precision = C.MT_PRECISION_FP32
	// PrecisionLean: 16-bit block-scaled weights, 8-bit AdamW moments (6.05 bytes of host state a parameter)
	PrecisionLean Precision = C.MT_PRECISION_LEAN
)

// RopeScaling is a rotary embedding scaling (mt_rope_scaling).
type RopeScaling uint32

// The rope scalings.
const (
	RopeScalingNone     RopeScaling = C.MT_ROPE_SCALING_NONE
	RopeScalingLlama3   RopeScaling = C.MT_ROPE_SCALING_LLAMA3
	RopeScalingLinear   RopeScaling = C.MT_ROPE_SCALING_LINEAR
	RopeScalingYarn     RopeScaling = C.MT_ROPE_SCALING_YARN
	RopeScalingLongrope RopeScaling = C.MT_ROPE_SCALING_LONGROPE
)

// MoeScoring is how a router's logits become the scores that choose and weigh
// the experts (mt_moe_scoring).
type MoeScoring uint32

// The router scorings.
const (
	// MoeScoringSoftmax: the softmax of the logits; a group's score its best expert's (DeepSeek-V2).
	MoeScoringSoftmax MoeScoring = C.MT_MOE_SCORING_SOFTMAX
	// MoeScoringSigmoid: sigmoid(logit); chosen by score + e_score_correction_bias, a group's
	// score the sum of its best two (DeepSeek-V3).
	MoeScoringSigmoid MoeScoring = C.MT_MOE_SCORING_SIGMOID
)

// Backend is what runs a model (mt_backend).
type Backend uint32

// The backends.
const (
	BackendAuto Backend = C.MT_BACKEND_AUTO
	BackendCPU  Backend = C.MT_BACKEND_CPU
	BackendCUDA Backend = C.MT_BACKEND_CUDA
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCPU:
		return "CPU"
	case BackendCUDA:
		return "CUDA"
	}
	return "unknown backend"
}

// Placement says where a kind of state lives (mt_placement).
type Placement uint32

// The placements.
const (
	PlaceAuto   Placement = C.MT_PLACE_AUTO
	PlaceDevice Placement = C.MT_PLACE_DEVICE
	PlaceHost   Placement = C.MT_PLACE_HOST
)

// Pinning says whether host tiles are page-locked (mt_pinning).
type Pinning uint32

// The pinning modes.
const (
	PinAuto   Pinning = C.MT_PIN_AUTO
	PinAlways Pinning = C.MT_PIN_ALWAYS
	PinNever  Pinning = C.MT_PIN_NEVER
)

// Recompute says what the backward recomputes (mt_recompute).
type Recompute uint32

// The recompute modes.
const (
	RecomputeAuto Recompute = C.MT_RECOMPUTE_AUTO
	RecomputeFull Recompute = C.MT_RECOMPUTE_FULL
)

// Attention says which attention the CUDA backend runs (mt_attention).
type Attention uint32

// The attention choices.
const (
	AttentionAuto    Attention = C.MT_ATTENTION_AUTO
	AttentionKernels Attention = C.MT_ATTENTION_KERNELS
	AttentionCUDNN   Attention = C.MT_ATTENTION_CUDNN
)

// WeightFetch says how each GPU of a data-parallel model receives a
// unit's weights (mt_weight_fetch).
type WeightFetch uint32

// The ways to fetch weights.
const (
	FetchAuto   WeightFetch = C.MT_FETCH_AUTO
	FetchWhole  WeightFetch = C.MT_FETCH_WHOLE
	FetchSlices WeightFetch = C.MT_FETCH_SLICES
)

// LogLevel is the severity of a log line (mt_log_level).
type LogLevel uint32

// The log levels.
const (
	LogDebug LogLevel = C.MT_LOG_DEBUG
	LogInfo  LogLevel = C.MT_LOG_INFO
	LogWarn  LogLevel = C.MT_LOG_WARN
	LogError LogLevel = C.MT_LOG_ERROR
)

// LRSchedule is a learning-rate schedule (mt_lr_schedule).
type LRSchedule uint32

// The schedules.
const (
	LRConstant LRSchedule = C.MT_LR_CONSTANT
	LRCosine   LRSchedule = C.MT_LR_COSINE
)

// TokenFormat is the layout of a token file (mt_token_format).
type TokenFormat uint32

// The token formats.
const (
	TokensAuto TokenFormat = C.MT_TOKENS_AUTO
	TokensU16  TokenFormat = C.MT_TOKENS_U16
	TokensU32  TokenFormat = C.MT_TOKENS_U32
	TokensLLMC TokenFormat = C.MT_TOKENS_LLMC
	TokensDocs TokenFormat = C.MT_TOKENS_DOCS // 0.2: documents with a loss mask (DocWriter)
)

// Split is a part of a dataset (mt_split).
type Split uint32

// The splits.
const (
	SplitTrain   Split = C.MT_SPLIT_TRAIN
	SplitHeldout Split = C.MT_SPLIT_HELDOUT
)

// Phase is the kind of a unit visit in a timeline (mt_phase).
type Phase uint32

// The phases.
const (
	PhaseForward  Phase = C.MT_PHASE_FORWARD
	PhaseHead     Phase = C.MT_PHASE_HEAD
	PhaseBackward Phase = C.MT_PHASE_BACKWARD
)

// The causes of the compute stream's idle time, indexes into the
// WaitSeconds arrays (mt_wait).
const (
	WaitWeights     = C.MT_WAIT_WEIGHTS
	WaitOptimizer   = C.MT_WAIT_OPTIMIZER
	WaitCheckpoints = C.MT_WAIT_CHECKPOINTS
	WaitLaunch      = C.MT_WAIT_LAUNCH
	WaitHost        = C.MT_WAIT_HOST
	WaitCount       = C.MT_WAIT_COUNT    // the causes this header knows
	WaitCapacity    = C.MT_WAIT_CAPACITY // the length of the WaitSeconds arrays
)

// IgnoreIndex as a target is not predicted (prompt tokens, padding).
const IgnoreIndex = C.MT_IGNORE_INDEX

func b2u(b bool) C.uint32_t {
	if b {
		return 1
	}
	return 0
}

// ---- model configuration ----

// ModelConfig is the shape of a model (mt_model_config); field names follow
// Hugging Face's config.json.
type ModelConfig struct {
	Arch                    Arch
	VocabSize               uint32
	HiddenSize              uint32
	IntermediateSize        uint32
	NumHiddenLayers         uint32
	NumAttentionHeads       uint32
	NumKeyValueHeads        uint32
	HeadDim                 uint32 // 0: HiddenSize / NumAttentionHeads
	MaxPositionEmbeddings   uint32
	RMSNormEps              float32
	RopeTheta               float32
	RopeScaling             RopeScaling
	RopeFactor              float32
	RopeLowFreqFactor       float32
	RopeHighFreqFactor      float32
	RopeOriginalMaxPosition uint32
	AttentionBias           bool
	TieWordEmbeddings       bool
	Precision               Precision
	Seed                    uint64
	InitializerRange        float32
	// SlidingWindow 0: none; W: a sliding layer's query i sees keys i-W+1..i only.
	SlidingWindow uint32
	// SlidingWindowPattern 0: every layer from MaxWindowLayers slides; P: of
	// those, layer i with (i+1)%P == 0 attends fully.
	SlidingWindowPattern uint32
	// MaxWindowLayers: the layers below this attend fully.
	MaxWindowLayers uint32
	// QueryPreAttnScalar: 0: head_dim; attention scores are scaled by its -1/2 power.
	QueryPreAttnScalar float32
	// RopeLocalBaseFreq: 0: rope_theta; the RoPE base of the sliding layers (Gemma 3).
	RopeLocalBaseFreq float32
	// AttnLogitSoftcapping: 0: none; c: attention scores s become c * tanh(s / c).
	AttnLogitSoftcapping float32
	// FinalLogitSoftcapping: 0: none; c: the same on the LM head's logits.
	FinalLogitSoftcapping float32
	// NumExperts: 0: dense MLPs; E: each sparse layer's MLP is E experts and a router.
	NumExperts uint32
	// NumExpertsPerTok: k: each token's output is the weighted sum of its k best experts'.
	NumExpertsPerTok uint32
	// MoeIntermediateSize: Each expert's inner width.
	MoeIntermediateSize uint32
	// NormTopkProb: Non-zero: the k routing weights are renormalised to sum to 1.
	NormTopkProb uint32
	// DecoderSparseStep: 0 or 1: every layer is sparse; s: layer l is when (l + 1) % s == 0.
	DecoderSparseStep uint32
	// OutputRouterLogits: Non-zero: the load-balancing loss is added to the training loss.
	OutputRouterLogits uint32
	// RouterAuxLossCoef: The load-balancing loss's weight.
	RouterAuxLossCoef float32
	// MlpOnlyLayers: bit l%64 of word l/64: layer l has a dense MLP.
	MlpOnlyLayers [4]uint64
	// PadTokenID: -1 none; p: the embedding's padding row (nn.Embedding's padding_idx),
	// zero at the start and given no gradient by the tokens that look it up.
	PadTokenID int32
	// SharedExpertIntermediateSize: 0 none; S: each sparse layer also runs a shared expert of width S.
	SharedExpertIntermediateSize uint32
	// SharedExpertGate: non-zero: the shared expert's output is scaled by sigmoid(x . w) (Qwen2-MoE).
	SharedExpertGate uint32
	// PartialRotaryFactor: 0 or 1: RoPE turns all of head_dim; f: its first int(head_dim * f) dimensions.
	PartialRotaryFactor float32
	// RopeAttentionFactor: yarn, longrope: the factor of cos and sin; 0: the scaling's default.
	RopeAttentionFactor float32
	// RopeBetaFast, RopeBetaSlow: yarn's correction range (0: 32 and 1).
	RopeBetaFast, RopeBetaSlow float32
	// RopeMscale, RopeMscaleAllDim: yarn: their ratio sets the default attention factor (0: none).
	RopeMscale, RopeMscaleAllDim float32
	// RopeNoTruncate: yarn: non-zero: the correction range is not rounded to whole dimensions.
	RopeNoTruncate uint32
	// RopeNFactors: longrope: the entries of each factor list (rotary dimensions / 2).
	RopeNFactors uint32
	// RopeShortFactor, RopeLongFactor: longrope's divisors below and past original_max_position.
	RopeShortFactor, RopeLongFactor [128]float32
	// KVLoraRank: 0 plain attention; R: multi-head latent attention, each token's keys and values
	// expanded from a rank-R latent (kv_a_proj_with_mqa, kv_b_proj).
	KVLoraRank uint32
	// QLoraRank: with KVLoraRank: 0, q_proj from the hidden state; R, q from a rank-R latent
	// (q_a_proj, q_b_proj).
	QLoraRank uint32
	// QKNopeHeadDim, QKRopeHeadDim: with KVLoraRank: each q and k head's dimensions without RoPE,
	// then with it (the key's shared by all heads); head_dim is their sum.
	QKNopeHeadDim, QKRopeHeadDim uint32
	// VHeadDim: with KVLoraRank: each value head's dimensions (at most head_dim).
	VHeadDim uint32
	// RopeInterleave: with KVLoraRank: non-zero: RoPE turns the pairs (2i, 2i+1), not (i, i+d/2).
	RopeInterleave uint32
	// NGroup, TopkGroup: 0 or 1: no group limit; G: the experts form G groups of E/G and a
	// token's k are chosen from its TopkGroup best groups.
	NGroup, TopkGroup uint32
	// RoutedScalingFactor: 0 or 1: none; s: the routing weights are multiplied by s.
	RoutedScalingFactor float32
	// MoeScoring: how the router scores the experts.
	MoeScoring MoeScoring
	// AttentionChunkSize: 0 none; N: on the layers with RoPE, query i sees only the keys of its
	// chunk of N, from N * floor(i / N) (Llama 4's chunked attention).
	AttentionChunkSize uint32
	// QKL2Norm: non-zero: on the layers with RoPE, each head of q and k is divided by its root
	// mean square (+ rms_norm_eps), no weight, after RoPE (Llama 4).
	QKL2Norm uint32
	// AttnTemperatureFloor, AttnTemperatureScale: 0 none; F: on the NoPE layers, q of token i of
	// its sequence is scaled by 1 + AttnTemperatureScale * log1p(floor((i + 1) / F)) (Llama 4).
	AttnTemperatureFloor, AttnTemperatureScale float32
	// MoeInputWeighted: non-zero: each routing weight scales its expert's input, not its output
	// (Llama 4).
	MoeInputWeighted uint32
	// NopeLayers: bit l%64 of word l/64: layer l has no RoPE and attends to the whole sequence
	// (Llama 4's no_rope_layers, inverted; l < 256).
	NopeLayers [4]uint64
}

// NewModelConfig returns the library's default configuration.
func NewModelConfig() ModelConfig {
	var c C.mt_model_config
	C.mt_model_config_init(&c)
	return modelConfigFromC(&c)
}

func (g *ModelConfig) toC() C.mt_model_config {
	var c C.mt_model_config
	C.mt_model_config_init(&c)
	c.arch = C.uint32_t(g.Arch)
	c.vocab_size = C.uint32_t(g.VocabSize)
	c.hidden_size = C.uint32_t(g.HiddenSize)
	c.intermediate_size = C.uint32_t(g.IntermediateSize)
	c.num_hidden_layers = C.uint32_t(g.NumHiddenLayers)
	c.num_attention_heads = C.uint32_t(g.NumAttentionHeads)
	c.num_key_value_heads = C.uint32_t(g.NumKeyValueHeads)
	c.head_dim = C.uint32_t(g.HeadDim)
	c.max_position_embeddings = C.uint32_t(g.MaxPositionEmbeddings)
	c.rms_norm_eps = C.float(g.RMSNormEps)
	c.rope_theta = C.float(g.RopeTheta)
	c.rope_scaling = C.uint32_t(g.RopeScaling)
	c.rope_factor = C.float(g.RopeFactor)
	c.rope_low_freq_factor = C.float(g.RopeLowFreqFactor)
	c.rope_high_freq_factor = C.float(g.RopeHighFreqFactor)
	c.rope_original_max_position = C.uint32_t(g.RopeOriginalMaxPosition)
	c.attention_bias = b2u(g.AttentionBias)
	c.tie_word_embeddings = b2u(g.TieWordEmbeddings)
	c.precision = C.uint32_t(g.Precision)
	c.seed = C.uint64_t(g.Seed)
	c.initializer_range = C.float(g.InitializerRange)
	c.sliding_window = C.uint32_t(g.SlidingWindow)
	c.sliding_window_pattern = C.uint32_t(g.SlidingWindowPattern)
	c.max_window_layers = C.uint32_t(g.MaxWindowLayers)
	c.query_pre_attn_scalar = C.float(g.QueryPreAttnScalar)
	c.rope_local_base_freq = C.float(g.RopeLocalBaseFreq)
	c.attn_logit_softcapping = C.float(g.AttnLogitSoftcapping)
	c.final_logit_softcapping = C.float(g.FinalLogitSoftcapping)
	c.num_experts = C.uint32_t(g.NumExperts)
	c.num_experts_per_tok = C.uint32_t(g.NumExpertsPerTok)
	c.moe_intermediate_size = C.uint32_t(g.MoeIntermediateSize)
	c.norm_topk_prob = C.uint32_t(g.NormTopkProb)
	c.decoder_sparse_step = C.uint32_t(g.DecoderSparseStep)
	c.output_router_logits = C.uint32_t(g.OutputRouterLogits)
	c.router_aux_loss_coef = C.float(g.RouterAuxLossCoef)
	for i := range g.MlpOnlyLayers {
		c.mlp_only_layers[i] = C.uint64_t(g.MlpOnlyLayers[i])
	}
	c.pad_token_id = C.int32_t(g.PadTokenID)
	c.shared_expert_intermediate_size = C.uint32_t(g.SharedExpertIntermediateSize)
	c.shared_expert_gate = C.uint32_t(g.SharedExpertGate)
	c.partial_rotary_factor = C.float(g.PartialRotaryFactor)
	c.rope_attention_factor = C.float(g.RopeAttentionFactor)
	c.rope_beta_fast, c.rope_beta_slow = C.float(g.RopeBetaFast), C.float(g.RopeBetaSlow)
	c.rope_mscale, c.rope_mscale_all_dim = C.float(g.RopeMscale), C.float(g.RopeMscaleAllDim)
	c.rope_no_truncate = C.uint32_t(g.RopeNoTruncate)
	c.rope_n_factors = C.uint32_t(g.RopeNFactors)
	for i := range g.RopeShortFactor {
		c.rope_short_factor[i] = C.float(g.RopeShortFactor[i])
		c.rope_long_factor[i] = C.float(g.RopeLongFactor[i])
	}
	c.kv_lora_rank = C.uint32_t(g.KVLoraRank)
	c.q_lora_rank = C.uint32_t(g.QLoraRank)
	c.qk_nope_head_dim, c.qk_rope_head_dim = C.uint32_t(g.QKNopeHeadDim), C.uint32_t(g.QKRopeHeadDim)
	c.v_head_dim = C.uint32_t(g.VHeadDim)
	c.rope_interleave = C.uint32_t(g.RopeInterleave)
	c.n_group, c.topk_group = C.uint32_t(g.NGroup), C.uint32_t(g.TopkGroup)
	c.routed_scaling_factor = C.float(g.RoutedScalingFactor)
	c.moe_scoring = C.uint32_t(g.MoeScoring)
	c.attention_chunk_size = C.uint32_t(g.AttentionChunkSize)
	c.qk_l2_norm = C.uint32_t(g.QKL2Norm)
	c.attn_temperature_floor = C.float(g.AttnTemperatureFloor)
	c.attn_temperature_scale = C.float(g.AttnTemperatureScale)
	c.moe_input_weighted = C.uint32_t(g.MoeInputWeighted)
	for i := range g.NopeLayers {
		c.nope_layers[i] = C.uint64_t(g.NopeLayers[i])
	}
	return c
}

func modelConfigFromC(c *C.mt_model_config) ModelConfig {
	g := ModelConfig{
		Arch:                         Arch(c.arch),
		VocabSize:                    uint32(c.vocab_size),
		HiddenSize:                   uint32(c.hidden_size),
		IntermediateSize:             uint32(c.intermediate_size),
		NumHiddenLayers:              uint32(c.num_hidden_layers),
		NumAttentionHeads:            uint32(c.num_attention_heads),
		NumKeyValueHeads:             uint32(c.num_key_value_heads),
		HeadDim:                      uint32(c.head_dim),
		MaxPositionEmbeddings:        uint32(c.max_position_embeddings),
		RMSNormEps:                   float32(c.rms_norm_eps),
		RopeTheta:                    float32(c.rope_theta),
		RopeScaling:                  RopeScaling(c.rope_scaling),
		RopeFactor:                   float32(c.rope_factor),
		RopeLowFreqFactor:            float32(c.rope_low_freq_factor),
		RopeHighFreqFactor:           float32(c.rope_high_freq_factor),
		RopeOriginalMaxPosition:      uint32(c.rope_original_max_position),
		AttentionBias:                c.attention_bias != 0,
		TieWordEmbeddings:            c.tie_word_embeddings != 0,
		Precision:                    Precision(c.precision),
		Seed:                         uint64(c.seed),
		InitializerRange:             float32(c.initializer_range),
		SlidingWindow:                uint32(c.sliding_window),
		SlidingWindowPattern:         uint32(c.sliding_window_pattern),
		MaxWindowLayers:              uint32(c.max_window_layers),
		QueryPreAttnScalar:           float32(c.query_pre_attn_scalar),
		RopeLocalBaseFreq:            float32(c.rope_local_base_freq),
		AttnLogitSoftcapping:         float32(c.attn_logit_softcapping),
		FinalLogitSoftcapping:        float32(c.final_logit_softcapping),
		NumExperts:                   uint32(c.num_experts),
		NumExpertsPerTok:             uint32(c.num_experts_per_tok),
		MoeIntermediateSize:          uint32(c.moe_intermediate_size),
		NormTopkProb:                 uint32(c.norm_topk_prob),
		DecoderSparseStep:            uint32(c.decoder_sparse_step),
		OutputRouterLogits:           uint32(c.output_router_logits),
		RouterAuxLossCoef:            float32(c.router_aux_loss_coef),
		PadTokenID:                   int32(c.pad_token_id),
		SharedExpertIntermediateSize: uint32(c.shared_expert_intermediate_size),
		SharedExpertGate:             uint32(c.shared_expert_gate),
		PartialRotaryFactor:          float32(c.partial_rotary_factor),
		RopeAttentionFactor:          float32(c.rope_attention_factor),
		RopeBetaFast:                 float32(c.rope_beta_fast),
		RopeBetaSlow:                 float32(c.rope_beta_slow),
		RopeMscale:                   float32(c.rope_mscale),
		RopeMscaleAllDim:             float32(c.rope_mscale_all_dim),
		RopeNoTruncate:               uint32(c.rope_no_truncate),
		RopeNFactors:                 uint32(c.rope_n_factors),
		KVLoraRank:                   uint32(c.kv_lora_rank),
		QLoraRank:                    uint32(c.q_lora_rank),
		QKNopeHeadDim:                uint32(c.qk_nope_head_dim),
		QKRopeHeadDim:                uint32(c.qk_rope_head_dim),
		VHeadDim:                     uint32(c.v_head_dim),
		RopeInterleave:               uint32(c.rope_interleave),
		NGroup:                       uint32(c.n_group),
		TopkGroup:                    uint32(c.topk_group),
		RoutedScalingFactor:          float32(c.routed_scaling_factor),
		MoeScoring:                   MoeScoring(c.moe_scoring),
		AttentionChunkSize:           uint32(c.attention_chunk_size),
		QKL2Norm:                     uint32(c.qk_l2_norm),
		AttnTemperatureFloor:         float32(c.attn_temperature_floor),
		AttnTemperatureScale:         float32(c.attn_temperature_scale),
		MoeInputWeighted:             uint32(c.moe_input_weighted),
	}
	for i := range g.RopeShortFactor {
		g.RopeShortFactor[i] = float32(c.rope_short_factor[i])
		g.RopeLongFactor[i] = float32(c.rope_long_factor[i])
	}
	for i := range g.MlpOnlyLayers {
		g.MlpOnlyLayers[i] = uint64(c.mlp_only_layers[i])
	}
	for i := range g.NopeLayers {
		g.NopeLayers[i] = uint64(c.nope_layers[i])
	}
	return g
}

// LoadConfig reads a Hugging Face model folder's config.json. Precision,
// Seed and InitializerRange come from base, everything else from the file.
func LoadConfig(dir string, base ModelConfig) (ModelConfig, error) {
	if versionErr != nil {
		return base, versionErr
	}
	c := base.toC()
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	if err := threadCall(func() C.mt_status { return C.mt_config_load(&c, cdir) }); err != nil {
		return base, err
	}
	return modelConfigFromC(&c), nil
}

// ---- offload policy ----

// OffloadPolicy says where state lives and what runs it (mt_offload_policy).
//
// Log and Abort run inside the library's calls, with the model's mutex
// held: they must not call methods of the model they belong to. A panic in
// either is recovered there (an Abort that panics stops the work) and raised
// again when the library's call has returned.
type OffloadPolicy struct {
	Backend          Backend
	Device           int32  // CUDA device index
	WeightSlots      uint32 // GPU weight buffers, >= 2
	GPUBudgetBytes   uint64 // 0: the device's free memory
	HostBudgetBytes  uint64 // 0: the memory the machine has available
	NUMANode         int32  // -1: the node nearest the GPU (or none)
	OptimizerThreads uint32 // 0: one per core of the NUMA node
	Activations      Placement
	PinHost          Pinning

	// Log receives the library's log lines at LogLevel and above, on the
	// goroutine that called into the library; nil: warnings and errors go
	// to stderr.
	Log      func(level LogLevel, text string)
	LogLevel LogLevel

	Timeline bool // record each step's timeline (CUDA backend)

	// Abort is polled during long work; returning true stops it with
	// StatusAborted, leaving the model as it was before the call.
	Abort func() bool

	Recompute Recompute

	Attention Attention
	// NondeterministicAttention lets cuDNN's attention backward add dQ with
	// atomics: faster, not bit-reproducible (MT_ATTENTION_NONDETERMINISTIC).
	NondeterministicAttention bool

	// Devices: two or more CUDA device indices train data parallel on one
	// host copy of the model (each step's micro-batches divided among them,
	// a multiple of their number; gradients reduced over NCCL); one: that
	// GPU; empty: Device.
	Devices []int32
	// WeightFetch: each of those GPUs copies a unit's weights whole over
	// its own link, or a slice each completed by an NCCL all-gather.
	WeightFetch WeightFetch
}

// NewOffloadPolicy returns the library's default policy.
func NewOffloadPolicy() OffloadPolicy {
	var c C.mt_offload_policy
	C.mt_offload_policy_init(&c)
	return OffloadPolicy{
		Backend:                   Backend(c.backend),
		Device:                    int32(c.device),
		WeightSlots:               uint32(c.weight_slots),
		GPUBudgetBytes:            uint64(c.gpu_budget_bytes),
		HostBudgetBytes:           uint64(c.host_budget_bytes),
		NUMANode:                  int32(c.numa_node),
		OptimizerThreads:          uint32(c.optimizer_threads),
		Activations:               Placement(c.activations),
		PinHost:                   Pinning(c.pin_host),
		LogLevel:                  LogLevel(c.log_level),
		Timeline:                  c.timeline != 0,
		Recompute:                 Recompute(c.recompute),
		Attention:                 Attention(c.attention),
		NondeterministicAttention: c.attention_flags&C.MT_ATTENTION_NONDETERMINISTIC != 0,
		WeightFetch:               WeightFetch(c.weight_fetch),
	}
}

// toC converts the policy. With withCallbacks, Log and Abort are wired
// through a new handle, which the caller must delete once the library can
// no longer call them (0 when neither is set).
//
// The device list goes to C memory (cgo lets no Go pointer inside a struct
// cross): release frees it once the call that reads the policy is over.
func (g *OffloadPolicy) toC(withCallbacks bool) (c C.mt_offload_policy, cb *callbacks, h cgo.Handle, release func()) {
	C.mt_offload_policy_init(&c)
	release = func() {}
	if len(g.Devices) > 1 {
		n := len(g.Devices)
		p := (*C.int32_t)(C.malloc(C.size_t(n) * 4))
		copy(unsafe.Slice((*int32)(unsafe.Pointer(p)), n), g.Devices)
		c.num_devices = C.uint32_t(n)
		c.devices = p
		release = func() { C.free(unsafe.Pointer(p)) }
	}
	c.backend = C.uint32_t(g.Backend)
	c.device = C.int32_t(g.Device)
	if len(g.Devices) == 1 {
		c.device = C.int32_t(g.Devices[0])
	}
	c.weight_slots = C.uint32_t(g.WeightSlots)
	c.weight_fetch = C.uint32_t(g.WeightFetch)
	c.gpu_budget_bytes = C.uint64_t(g.GPUBudgetBytes)
	c.host_budget_bytes = C.uint64_t(g.HostBudgetBytes)
	c.numa_node = C.int32_t(g.NUMANode)
	c.optimizer_threads = C.uint32_t(g.OptimizerThreads)
	c.activations = C.uint32_t(g.Activations)
	c.pin_host = C.uint32_t(g.PinHost)
	c.log_level = C.uint32_t(g.LogLevel)
	c.timeline = b2u(g.Timeline)
	c.recompute = C.uint32_t(g.Recompute)
	c.attention = C.uint32_t(g.Attention)
	c.attention_flags = 0
	if g.NondeterministicAttention {
		c.attention_flags = C.MT_ATTENTION_NONDETERMINISTIC
	}
	if !withCallbacks || (g.Log == nil && g.Abort == nil) {
		return c, nil, 0, release
	}
	cb = &callbacks{abort: g.Abort, log: g.Log}
	h = cgo.NewHandle(cb)
	var logH, abortH C.uintptr_t
	if g.Log != nil {
		logH = C.uintptr_t(h)
	}
	if g.Abort != nil {
		abortH = C.uintptr_t(h)
	}
	C.mtgo_set_callbacks(&c, logH, abortH)
	return c, cb, h, release
}

// ---- optimizer ----

// OptimConfig is AdamW's configuration and the learning-rate schedule
// (mt_optim_config).
type OptimConfig struct {
	Schedule    LRSchedule
	LR          float32 // peak learning rate
	Beta1       float32
	Beta2       float32
	Eps         float32
	WeightDecay float32 // applied to matrices only
	GradClip    float32 // global L2 norm; 0: no clipping
	MinLRRatio  float32 // cosine floor as a fraction of LR
	WarmupSteps uint32
	TotalSteps  uint32 // the length of the cosine schedule
}

// NewOptimConfig returns the library's default optimizer configuration.
func NewOptimConfig() OptimConfig {
	var c C.mt_optim_config
	C.mt_optim_config_init(&c)
	return OptimConfig{
		Schedule:    LRSchedule(c.schedule),
		LR:          float32(c.lr),
		Beta1:       float32(c.beta1),
		Beta2:       float32(c.beta2),
		Eps:         float32(c.eps),
		WeightDecay: float32(c.weight_decay),
		GradClip:    float32(c.grad_clip),
		MinLRRatio:  float32(c.min_lr_ratio),
		WarmupSteps: uint32(c.warmup_steps),
		TotalSteps:  uint32(c.total_steps),
	}
}

func (g *OptimConfig) toC() C.mt_optim_config {
	var c C.mt_optim_config
	C.mt_optim_config_init(&c)
	c.schedule = C.uint32_t(g.Schedule)
	c.lr = C.float(g.LR)
	c.beta1 = C.float(g.Beta1)
	c.beta2 = C.float(g.Beta2)
	c.eps = C.float(g.Eps)
	c.weight_decay = C.float(g.WeightDecay)
	c.grad_clip = C.float(g.GradClip)
	c.min_lr_ratio = C.float(g.MinLRRatio)
	c.warmup_steps = C.uint32_t(g.WarmupSteps)
	c.total_steps = C.uint32_t(g.TotalSteps)
	return c
}

// LRAt is the learning rate of step (0-based) under the schedule; NaN for
// an invalid configuration.
func (g OptimConfig) LRAt(step uint64) float32 {
	c := g.toC()
	return float32(C.mt_lr_at(&c, C.uint64_t(step)))
}

// ---- batches ----

// BatchShape is the shape of one optimizer step's batch (mt_batch_shape).
type BatchShape struct {
	MicroBatchSize  uint32 // sequences per micro-batch
	SeqLen          uint32 // tokens per sequence
	NumMicroBatches uint32 // micro-batches per optimizer step
}

// NewBatchShape returns the library's default shape.
func NewBatchShape() BatchShape {
	var c C.mt_batch_shape
	C.mt_batch_shape_init(&c)
	return BatchShape{
		MicroBatchSize:  uint32(c.micro_batch_size),
		SeqLen:          uint32(c.seq_len),
		NumMicroBatches: uint32(c.num_micro_batches),
	}
}

func (g *BatchShape) toC() C.mt_batch_shape {
	var c C.mt_batch_shape
	C.mt_batch_shape_init(&c)
	c.micro_batch_size = C.uint32_t(g.MicroBatchSize)
	c.seq_len = C.uint32_t(g.SeqLen)
	c.num_micro_batches = C.uint32_t(g.NumMicroBatches)
	return c
}

// Batch is one optimizer step's tokens (mt_batch): NumMicroBatches
// micro-batches of MicroBatchSize sequences of SeqLen tokens, in that
// order. Tokens and Targets must each hold exactly that many ids; a target
// may be IgnoreIndex. Eval and Step copy them into C memory for the call.
type Batch struct {
	MicroBatchSize  uint32
	SeqLen          uint32
	NumMicroBatches uint32
	Tokens          []int32
	Targets         []int32
	// Positions, when not nil, packs documents into each sequence: each
	// token's position in its document, 0 where one starts (the same length
	// as Tokens). Attention never crosses a document and RoPE restarts.
	Positions []int32
}

// NewBatch returns the library's default batch (all zero: no tokens).
func NewBatch() Batch {
	var c C.mt_batch
	C.mt_batch_init(&c)
	return Batch{
		MicroBatchSize:  uint32(c.micro_batch_size),
		SeqLen:          uint32(c.seq_len),
		NumMicroBatches: uint32(c.num_micro_batches),
	}
}

// ---- results ----

// StepStats describes one optimizer step (mt_step_stats).
type StepStats struct {
	Step             uint64 // optimizer steps taken, this one included
	Loss             float64
	GradNorm         float64 // before clipping
	LR               float32 // the learning rate this step used
	Tokens           uint64
	TargetTokens     uint64
	Seconds          float64
	ForwardSeconds   float64
	BackwardSeconds  float64
	OptimizerSeconds float64
}

func stepStatsFromC(c *C.mt_step_stats) StepStats {
	return StepStats{
		Step:             uint64(c.step),
		Loss:             float64(c.loss),
		GradNorm:         float64(c.grad_norm),
		LR:               float32(c.lr),
		Tokens:           uint64(c.tokens),
		TargetTokens:     uint64(c.target_tokens),
		Seconds:          float64(c.seconds),
		ForwardSeconds:   float64(c.forward_seconds),
		BackwardSeconds:  float64(c.backward_seconds),
		OptimizerSeconds: float64(c.optimizer_seconds),
	}
}

// EvalStats is the loss of a model on a batch (mt_eval_stats).
type EvalStats struct {
	Loss         float64
	Tokens       uint64
	TargetTokens uint64
	Seconds      float64
}

func evalStatsFromC(c *C.mt_eval_stats) EvalStats {
	return EvalStats{
		Loss:         float64(c.loss),
		Tokens:       uint64(c.tokens),
		TargetTokens: uint64(c.target_tokens),
		Seconds:      float64(c.seconds),
	}
}

// MemoryPlan is the bytes per tier a model would use (mt_memory_plan).
type MemoryPlan struct {
	Backend           Backend
	NumParams         uint64
	HostPinnedBytes   uint64
	HostPageableBytes uint64
	GPUBytes          uint64
	WeightBytes       uint64
	GradBytes         uint64
	MasterBytes       uint64
	OptimBytes        uint64
	ActivationBytes   uint64
	WorkspaceBytes    uint64
	HostBudgetBytes   uint64
	GPUBudgetBytes    uint64
	WeightSlots       uint32
	Activations       Placement
	NumUnits          uint32
	LargestUnitParams uint64
	// where the activation checkpoints go (0.2): how many live in host
	// memory, and how many the backward recomputes instead of keeping
	HostCheckpoints       uint32
	RecomputedCheckpoints uint32
}

func memoryPlanFromC(c *C.mt_memory_plan) MemoryPlan {
	return MemoryPlan{
		Backend:               Backend(c.backend),
		NumParams:             uint64(c.num_params),
		HostPinnedBytes:       uint64(c.host_pinned_bytes),
		HostPageableBytes:     uint64(c.host_pageable_bytes),
		GPUBytes:              uint64(c.gpu_bytes),
		WeightBytes:           uint64(c.weight_bytes),
		GradBytes:             uint64(c.grad_bytes),
		MasterBytes:           uint64(c.master_bytes),
		OptimBytes:            uint64(c.optim_bytes),
		ActivationBytes:       uint64(c.activation_bytes),
		WorkspaceBytes:        uint64(c.workspace_bytes),
		HostBudgetBytes:       uint64(c.host_budget_bytes),
		GPUBudgetBytes:        uint64(c.gpu_budget_bytes),
		WeightSlots:           uint32(c.weight_slots),
		Activations:           Placement(c.activations),
		NumUnits:              uint32(c.num_units),
		LargestUnitParams:     uint64(c.largest_unit_params),
		HostCheckpoints:       uint32(c.host_checkpoints),
		RecomputedCheckpoints: uint32(c.recomputed_checkpoints),
	}
}

// Plan computes the memory a model of cfg would use under pol (nil: the
// defaults) for batches of shape (nil: the persistent state alone), without
// allocating. When the plan does not fit it returns the plan all the same
// with an ErrHostBudget or ErrGPUBudget error. The policy's Log and Abort
// are not used.
func Plan(cfg ModelConfig, pol *OffloadPolicy, shape *BatchShape) (MemoryPlan, error) {
	if versionErr != nil {
		return MemoryPlan{}, versionErr
	}
	var out C.mt_memory_plan
	C.mt_memory_plan_init(&out)
	ccfg := cfg.toC()
	var cpol *C.mt_offload_policy
	if pol != nil {
		p, _, _, release := pol.toC(false)
		defer release()
		cpol = &p
	}
	var cshape *C.mt_batch_shape
	if shape != nil {
		s := shape.toC()
		cshape = &s
	}
	err := threadCall(func() C.mt_status { return C.mt_plan(&out, &ccfg, cpol, cshape) })
	return memoryPlanFromC(&out), err
}

// ---- timeline ----

// Timeline is where a step's time went on the GPU (mt_timeline).
type Timeline struct {
	NVisits     uint32
	Step        uint64
	Seconds     float64
	BusySeconds float64
	WaitSeconds [WaitCapacity]float64 // by cause: WaitWeights, ...
	H2DSeconds  float64
	D2HSeconds  float64
	H2DBytes    uint64
	D2HBytes    uint64
}

// TimelineVisit is one unit visit of a step (mt_timeline_visit).
type TimelineVisit struct {
	Unit         uint32 // 0 embedding, 1..L layers, L+1 head
	Phase        Phase
	Start, End   float64
	WeightsStart float64 // -1 without a weight copy
	WeightsEnd   float64
	WaitSeconds  [WaitCapacity]float64
}

func timelineFromC(c *C.mt_timeline) Timeline {
	t := Timeline{
		NVisits:     uint32(c.n_visits),
		Step:        uint64(c.step),
		Seconds:     float64(c.seconds),
		BusySeconds: float64(c.busy_seconds),
		H2DSeconds:  float64(c.h2d_seconds),
		D2HSeconds:  float64(c.d2h_seconds),
		H2DBytes:    uint64(c.h2d_bytes),
		D2HBytes:    uint64(c.d2h_bytes),
	}
	for i := range t.WaitSeconds {
		t.WaitSeconds[i] = float64(c.wait_seconds[i])
	}
	return t
}

func timelineVisitFromC(c *C.mt_timeline_visit) TimelineVisit {
	v := TimelineVisit{
		Unit:         uint32(c.unit),
		Phase:        Phase(c.phase),
		Start:        float64(c.start),
		End:          float64(c.end),
		WeightsStart: float64(c.weights_start),
		WeightsEnd:   float64(c.weights_end),
	}
	for i := range v.WaitSeconds {
		v.WaitSeconds[i] = float64(c.wait_seconds[i])
	}
	return v
}

// ---- checkpoints ----

// CheckpointInfo is what a resume checkpoint carries besides the model and
// optimizer state (mt_checkpoint_info).
type CheckpointInfo struct {
	Step         uint64 // on load: the steps the model had taken (ignored on save)
	DataPosition uint64 // the caller's, e.g. the next window of a Dataset
	RNGState     [4]uint64
	// CallerJSON is the caller's own state, the text of a JSON object kept
	// in trainer_state.json beside the library's keys; "" for none.
	CallerJSON string
}

// NewCheckpointInfo returns the library's default (all zero).
func NewCheckpointInfo() CheckpointInfo {
	var c C.mt_checkpoint_info
	C.mt_checkpoint_info_init(&c)
	return checkpointInfoFromC(&c)
}

// toC converts g; a non-empty CallerJSON is copied into C memory, which the
// caller frees with C.free(unsafe.Pointer(c.caller_json)) after the call.
func (g *CheckpointInfo) toC() C.mt_checkpoint_info {
	var c C.mt_checkpoint_info
	C.mt_checkpoint_info_init(&c)
	c.step = C.uint64_t(g.Step)
	c.data_position = C.uint64_t(g.DataPosition)
	for i, v := range g.RNGState {
		c.rng_state[i] = C.uint64_t(v)
	}
	if g.CallerJSON != "" {
		c.caller_json = C.CString(g.CallerJSON)
	}
	return c
}

func checkpointInfoFromC(c *C.mt_checkpoint_info) CheckpointInfo {
	g := CheckpointInfo{Step: uint64(c.step), DataPosition: uint64(c.data_position)}
	for i := range g.RNGState {
		g.RNGState[i] = uint64(c.rng_state[i])
	}
	if c.caller_json != nil {
		g.CallerJSON = C.GoString(c.caller_json)
	}
	return g
}

// ---- datasets ----

// DatasetOptions says how to read a token file (mt_dataset_options).
type DatasetOptions struct {
	Format          TokenFormat
	VocabSize       uint32  // ids >= this are refused at open; 0: no check
	SeqLen          uint32  // a window holds SeqLen + 1 tokens
	HeldoutFraction float32 // share of the windows held out, in [0, 0.5]
	Seed            uint64  // the order of the training windows
}

// NewDatasetOptions returns the library's default options.
func NewDatasetOptions() DatasetOptions {
	var c C.mt_dataset_options
	C.mt_dataset_options_init(&c)
	return DatasetOptions{
		Format:          TokenFormat(c.format),
		VocabSize:       uint32(c.vocab_size),
		SeqLen:          uint32(c.seq_len),
		HeldoutFraction: float32(c.heldout_fraction),
		Seed:            uint64(c.seed),
	}
}

func (g *DatasetOptions) toC() C.mt_dataset_options {
	var c C.mt_dataset_options
	C.mt_dataset_options_init(&c)
	c.format = C.uint32_t(g.Format)
	c.vocab_size = C.uint32_t(g.VocabSize)
	c.seq_len = C.uint32_t(g.SeqLen)
	c.heldout_fraction = C.float(g.HeldoutFraction)
	c.seed = C.uint64_t(g.Seed)
	return c
}
