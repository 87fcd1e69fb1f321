"""step_parts splits a compiled program's bytes and libtpu cycle estimates by part of the model."""

from bert_jax.tools import step_parts

# A hand-written optimised program in the form libtpu prints: a forward and a backward fusion of
# an encoder layer, a LayerNorm, a loop whose body holds the optimizer's update, an all-reduce,
# an asynchronous copy without op_name, and a fused computation whose inside must not count.
PROGRAM = '''HloModule jit_train_step

%fused_computation.1 (param_0.1: bf16[8,128]) -> bf16[8,128] {
  %param_0.1 = bf16[8,128]{1,0} parameter(0)
  ROOT %multiply.9 = bf16[8,128]{1,0} multiply(%param_0.1, %param_0.1), metadata={op_name="jit(train_step)/jvp(PretrainingModel)/bert/encoder/layer_0/intermediate/mul"}
}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %w = f32[256]{0} get-tuple-element(%p), index=1
  %update = f32[256]{0} fusion(%w), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/add"}, backend_config={"estimated_cycles":"40"}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[256]{0}) tuple(%i, %update)
}

%cond (p.1: (s32[], f32[256])) -> pred[] {
  %p.1 = (s32[], f32[256]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %c = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %c), direction=LT
}

ENTRY %main (x: bf16[8,128], w: f32[256]) -> (bf16[8,128], f32[256]) {
  %x = bf16[8,128]{1,0} parameter(0)
  %w.1 = f32[256]{0} parameter(1)
  %ffn = bf16[8,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(PretrainingModel)/bert/encoder/layer_0/intermediate/dense/dot_general"}, backend_config={"estimated_cycles":"100"}
  %attn = bf16[8,128]{1,0} fusion(%ffn, %x), kind=kOutput, calls=%fused_computation.1, metadata={op_name="jit(train_step)/transpose(jvp(PretrainingModel))/bert/encoder/layer_0/attention/self/dot_general"}, backend_config={"estimated_cycles":"300"}
  %norm = bf16[8,128]{1,0} fusion(%attn), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(PretrainingModel)/bert/encoder/layer_0/output/LayerNorm/reduce_sum"}
  %sum = f32[256]{0} all-reduce(%w.1), replica_groups={}, to_apply=%fused_computation.1
  %cs = (f32[256]{0}, f32[256]{0}, u32[]) copy-start(%sum)
  %cd = f32[256]{0} copy-done(%cs)
  %i.2 = s32[] constant(0)
  %init = (s32[], f32[256]{0}) tuple(%i.2, %cd)
  %loop = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body
  %new = f32[256]{0} get-tuple-element(%loop), index=1
  ROOT %out = (bf16[8,128]{1,0}, f32[256]{0}) tuple(%norm, %new)
}
'''

ROW = 8 * 128 * 2  # One bf16[8,128].
VECTOR = 256 * 4  # One f32[256].


def test_each_instruction_counts_its_operands_and_result_in_its_part():
  parts = step_parts.step_parts(PROGRAM)
  assert list(parts) == list(step_parts.PARTS)
  assert parts['feed_forward'] == {'bytes': 2 * ROW, 'cycles': 100}
  assert parts['attention'] == {'bytes': 3 * ROW, 'cycles': 300}  # The backward's dot too.
  assert parts['norms'] == {'bytes': 2 * ROW, 'cycles': 0}  # LayerNorm under `output`.
  assert parts['collectives'] == {'bytes': 2 * VECTOR, 'cycles': 0}
  assert parts['copies'] == {'bytes': 2 * VECTOR, 'cycles': 0}  # Start and done: once.
  # The loop's body counts once; the fused computation's own multiply never counts.
  assert parts['optimizer'] == {'bytes': 2 * VECTOR, 'cycles': 40}
  assert parts['other'] == {'bytes': 1 + 4 + 4, 'cycles': 0}  # The loop condition's compare.
  assert parts['embeddings'] == parts['heads_and_loss'] == {'bytes': 0, 'cycles': 0}
  assert step_parts.summed(parts, 'cycles') == 440
  assert step_parts.shares(parts, 'cycles')['attention'] == round(300 / 440, 3)


def test_op_names_map_to_the_model_parts():
  path = 'jit(train_step)/transpose(jvp(PretrainingModel))/'
  assert step_parts.part_of('fusion', path + 'bert/embeddings/jit(_take)/scatter-add') == (
      'embeddings')
  assert step_parts.part_of('fusion', path + 'bert/embeddings/LayerNorm/div') == 'norms'
  assert step_parts.part_of('fusion', path + 'predictions/transform_dense/dot_general') == (
      'heads_and_loss')
  assert step_parts.part_of('fusion', 'jit(train_step)/jvp()/reduce_sum') == 'heads_and_loss'
  assert step_parts.part_of('custom-call', path + 'bert/encoder/layer/attention/pallas_call') == (
      'attention')
  assert step_parts.part_of('fusion', path + 'bert/encoder/layer/output/dense/dot_general') == (
      'feed_forward')
  assert step_parts.part_of('all-gather-done', path + 'bert/encoder') == 'collectives'
  assert step_parts.part_of('fusion', 'jit(train_step)/sqrt') == 'optimizer'
  assert step_parts.part_of('custom-call', '') == 'other'


def test_probes_extrapolate_each_part_linearly_in_layers():
  one = {'attention': {'bytes': 10, 'cycles': 1}, 'optimizer': {'bytes': 50, 'cycles': 5}}
  two = {'attention': {'bytes': 16, 'cycles': 3}, 'optimizer': {'bytes': 60, 'cycles': 6}}
  assert step_parts.combine(one, two, extra_layers=23) == {
      'attention': {'bytes': 10 + 23 * 6, 'cycles': 1 + 23 * 2},
      'optimizer': {'bytes': 50 + 23 * 10, 'cycles': 5 + 23}}
