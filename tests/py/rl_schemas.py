"""Pydantic models of the foreign dialects' answers, written from their
sources (vLLM and SGLang cannot be imported without a GPU, so their own
classes are not used). The tests validate every answer of those routes with
them, on top of checking the values.

vLLM: vllm-project/vllm vllm/entrypoints/serve/disagg/protocol.py (main,
2026: GenerateResponse, GenerateResponseChoice, GenerateStreamResponse,
GenerateResponseStreamChoice), vllm/entrypoints/openai/engine/protocol.py
(UsageInfo, PromptTokenUsageInfo, ErrorResponse), chat_completion/protocol.py
(ChatCompletionLogProbs), vllm/logprobs.py (Logprob); with prime-rl's
subclass (src/prime_rl/inference/vllm/serving_tokens.py,
PrimeRlGenerateResponseChoice.routed_experts: dict, routed_experts.py's
{data, shape, start, dtype}, kept_tokens.py's {ids, counts}).
SGLang: sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
(the meta_info dict of /generate) as slime (THUDM/slime
slime/rollout/sglang_rollout.py @ 0044b40d) reads it.
Every model forbids unknown types where the original has a fixed type; the
extra fields the sampler adds (weight_version, weight_versions, sampling_mask,
kept_tokens) are declared here too, so a misspelt one fails."""
from typing import Optional

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- vLLM ----
class TopLogprob(_M):
    token: StrictStr
    logprob: StrictFloat
    bytes: Optional[list[StrictInt]] = None


class LogprobContent(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatCompletionLogProbs(_M):
    content: Optional[list[LogprobContent]] = None


class PromptTokenUsageInfo(_M):
    cached_tokens: Optional[StrictInt] = None


class UsageInfo(_M):
    prompt_tokens: StrictInt = 0
    total_tokens: StrictInt = 0
    completion_tokens: Optional[StrictInt] = 0
    prompt_tokens_details: Optional[PromptTokenUsageInfo] = None


class RoutedExperts(_M):  # prime-rl routed_experts.py serialize_routed_experts
    data: StrictStr
    shape: list[StrictInt]
    start: StrictInt
    dtype: StrictStr


class KeptTokens(_M):  # prime-rl kept_tokens.py serialize_kept_tokens
    ids: StrictStr
    counts: StrictStr


class Logprob(_M):
    logprob: float
    rank: Optional[StrictInt] = None
    decoded_token: Optional[StrictStr] = None


class GenerateResponseChoice(_M):
    index: StrictInt
    logprobs: Optional[ChatCompletionLogProbs] = None
    finish_reason: Optional[StrictStr] = "stop"
    token_ids: Optional[list[StrictInt]] = None
    routed_experts: Optional[RoutedExperts] = None
    sampling_mask: Optional[list[list[StrictInt]]] = None  # vLLM docs/training/sampling_mask.md
    kept_tokens: Optional[KeptTokens] = None
    weight_versions: list[list[StrictInt]]  # prime-rl weight_version.py: [[version, first token], ...]


class GenerateResponse(_M):
    request_id: StrictStr
    model: Optional[StrictStr] = None
    created: Optional[StrictInt] = None
    choices: list[GenerateResponseChoice]
    usage: Optional[UsageInfo] = None
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    kv_transfer_params: Optional[dict] = None
    weight_version: StrictInt


class GenerateResponseStreamChoice(_M):
    index: StrictInt
    logprobs: Optional[ChatCompletionLogProbs] = None
    finish_reason: Optional[StrictStr] = None
    token_ids: Optional[list[StrictInt]] = None
    routed_experts: Optional[RoutedExperts] = None
    sampling_mask: Optional[list[list[StrictInt]]] = None
    kept_tokens: Optional[KeptTokens] = None
    weight_versions: Optional[list[list[StrictInt]]] = None


class GenerateStreamResponse(_M):
    request_id: StrictStr
    choices: list[GenerateResponseStreamChoice]
    usage: Optional[UsageInfo] = None


class ErrorInfo(_M):
    message: StrictStr
    type: StrictStr
    param: Optional[StrictStr] = None
    code: Optional[object] = None


class ErrorResponse(_M):
    error: ErrorInfo


# ---- SGLang ----
class SglFinish(_M):
    type: StrictStr
    matched: Optional[object] = None
    length: Optional[StrictInt] = None
    message: Optional[StrictStr] = None


class SglMeta(_M):
    id: StrictStr
    finish_reason: Optional[SglFinish]
    prompt_tokens: StrictInt
    completion_tokens: StrictInt
    cached_tokens: StrictInt
    weight_version: StrictStr
    e2e_latency: float
    input_token_logprobs: Optional[list[tuple[Optional[float], StrictInt, Optional[StrictStr]]]] = None
    output_token_logprobs: Optional[list[tuple[float, StrictInt, Optional[StrictStr]]]] = None
    input_top_logprobs: Optional[list[Optional[list[tuple[float, StrictInt, Optional[StrictStr]]]]]] = None
    output_top_logprobs: Optional[list[list[tuple[float, StrictInt, Optional[StrictStr]]]]] = None
    routed_experts: Optional[StrictStr] = None  # base64 int32 [n_prompt + n_out - 1, layers * top_k]
    sampling_mask: Optional[list[list[StrictInt]]] = None


class SglOutput(_M):
    text: StrictStr
    output_ids: list[StrictInt]
    meta_info: SglMeta
    index: Optional[StrictInt] = None


class SglError(_M):
    class _E(_M):
        message: StrictStr
    error: _E


class SglResult(_M):
    success: StrictBool
    message: StrictStr
    num_paused_requests: Optional[StrictInt] = None
