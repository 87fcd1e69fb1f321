"""Reads original Google TF BERT checkpoints (bert_model.ckpt.*) without TensorFlow.

A TF checkpoint is a TensorBundle: `{prefix}.index` is an SSTable (LevelDB's table format)
mapping each variable name to a serialized BundleEntryProto (dtype, shape, shard, offset,
size, crc32c), and the tensor bytes sit little-endian in `{prefix}.data-SSSSS-of-NNNNN`.
Everything here is parsed by hand (SSTable blocks, protobuf wire format, snappy, crc32c), so
importing original checkpoints needs only numpy.

`tf_to_hf_state_dict` then renames the original variables to HuggingFace BertForPreTraining
names and layouts, so the importer for HF weights can take it from there.
"""

import functools
import json
import os
import re
import struct

import numpy as np

# --- crc32c (Castagnoli), vectorised with numpy --------------------------------------------
#
# The crc register is linear over GF(2): feeding n zero bytes is a 32x32 bit matrix Z_n, and
# feeding a 4-byte word w is reg -> Z_4(reg ^ w). That lets many lanes run in lock-step as
# numpy ops (a byte-at-a-time python loop would take minutes for BERT-base).

_CRC_POLY = 0x82F63B78  # Reflected Castagnoli polynomial.
_CRC_MASK_DELTA = 0xA282EAD8
_MAX_LANES = 1 << 16


def _byte_table() -> np.ndarray:
  """The classic table: the register contribution of each byte value."""
  t = np.arange(256, dtype=np.uint32)
  for _ in range(8):
    t = np.where(t & 1, (t >> 1) ^ np.uint32(_CRC_POLY), t >> 1).astype(np.uint32)
  return t


_BYTE_TABLE = _byte_table()


def _matrix_tables(cols: np.ndarray) -> np.ndarray:
  """(4, 256) lookup tables, one per input byte, of the matrix with these column images."""
  v = np.arange(256, dtype=np.uint32)[:, None]
  bits = (v >> np.arange(8, dtype=np.uint32)) & 1
  return np.stack([np.bitwise_xor.reduce(np.where(bits, cols[8 * b:8 * b + 8], 0), axis=1)
                   for b in range(4)]).astype(np.uint32)


def _apply(tables: np.ndarray, x):
  """Applies a matrix, given by its byte tables, to uint32 scalars or arrays."""
  return (tables[0][x & 0xFF] ^ tables[1][(x >> 8) & 0xFF] ^ tables[2][(x >> 16) & 0xFF]
          ^ tables[3][x >> 24])


@functools.cache
def _zeros_power(k: int) -> np.ndarray:
  """Byte tables of Z_(2**k): feeding 2**k zero bytes to a raw register."""
  if k == 0:
    basis = np.uint32(1) << np.arange(32, dtype=np.uint32)
    return _matrix_tables((basis >> 8) ^ _BYTE_TABLE[basis & 0xFF])
  half = _zeros_power(k - 1)
  basis = np.uint32(1) << np.arange(32, dtype=np.uint32)
  return _matrix_tables(_apply(half, _apply(half, basis)))


def _shift(x, num_bytes: int):
  """Z_num_bytes applied to x, one cached power of two per set bit."""
  for k in range(num_bytes.bit_length()):
    if num_bytes >> k & 1:
      x = _apply(_zeros_power(k), x)
  return x


@functools.cache
def _stride_tables(lanes: int) -> tuple[np.ndarray, np.ndarray]:
  """16-bit lookup tables (low half, high half of the input) of Z_(4 * lanes)."""
  t = _zeros_power((4 * lanes).bit_length() - 1)
  v = np.arange(65536, dtype=np.uint32)
  return t[0][v & 0xFF] ^ t[1][v >> 8], t[2][v & 0xFF] ^ t[3][v >> 8]


def _lanes_crc(words: np.ndarray, lanes: int) -> np.uint32:
  """Raw register (zero start) after feeding uint32 words, a multiple of lanes of them."""
  # Word i * lanes + j goes to lane j, so each row is contiguous. A lane runs
  # reg = Z_(4 * lanes)(reg) ^ w: the bytes of the other lanes' words count as zeros there.
  low, high = _stride_tables(lanes)
  reg, a, b, i1, i2 = (np.zeros(lanes, np.uint32) for _ in range(5))
  for row in words.reshape(-1, lanes):
    np.bitwise_and(reg, 0xFFFF, out=i1)
    np.right_shift(reg, 16, out=i2)
    np.take(low, i1, out=a, mode='clip')  # 'clip' skips bounds checks; indices fit.
    np.take(high, i2, out=b, mode='clip')
    np.bitwise_xor(a, b, out=reg)
    reg ^= row
  # Lane j still owes Z_(4 * (lanes - j)); merging neighbours as Z_4s(left) ^ right keeps
  # that form with half the lanes, until one lane owes Z_4.
  k = 2
  while reg.size > 1:
    reg = _apply(_zeros_power(k), reg[0::2]) ^ reg[1::2]
    k += 1
  return _apply(_zeros_power(2), reg[0])


def _raw_crc(data: np.ndarray) -> int:
  """Raw register after a uint8 array from a zero start (no pre/post inversion)."""
  lanes = 1 << min(16, max(0, (data.size // 32).bit_length() - 1))
  if lanes == 1:  # A zero register stays zero over zero bytes: pad in front to whole words.
    padded = np.zeros(-(-data.size // 4) * 4, np.uint8)
    padded[padded.size - data.size:] = data
    return int(_lanes_crc(padded.view('<u4').astype(np.uint32), 1))
  # crc(body || tail) = Z_len(tail)(crc(body)) ^ crc(tail); the body needs no copy.
  body = data.size - data.size % (4 * lanes)
  reg = _lanes_crc(data[:body].view('<u4').astype(np.uint32, copy=False), lanes)
  return int(_shift(reg, data.size - body)) ^ _raw_crc(data[body:])


def crc32c(data) -> int:
  """CRC-32C of bytes-like or uint8 array `data`, as TF and LevelDB compute it."""
  arr = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
  arr = arr.reshape(-1)
  return int(_shift(np.uint32(0xFFFFFFFF), arr.size)) ^ _raw_crc(arr) ^ 0xFFFFFFFF


def _unmask_crc(masked: int) -> int:
  """Inverts crc32c::Mask, which TF applies to every crc it stores."""
  rot = (masked - _CRC_MASK_DELTA) & 0xFFFFFFFF
  return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# --- protobuf wire format ------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
  """Decodes a base-128 varint at pos; returns (value, next position)."""
  result = shift = 0
  while True:
    if pos >= len(buf):
      raise ValueError('truncated varint')
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if not b & 0x80:
      return result, pos
    shift += 7


def _proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
  """(field number, value) pairs of a serialized message; LEN fields stay as bytes."""
  fields, pos = [], 0
  while pos < len(buf):
    key, pos = _varint(buf, pos)
    number, wire_type = key >> 3, key & 7
    if wire_type == 0:
      value, pos = _varint(buf, pos)
    elif wire_type == 1:
      value, pos = struct.unpack_from('<Q', buf, pos)[0], pos + 8
    elif wire_type == 2:
      length, pos = _varint(buf, pos)
      value, pos = bytes(buf[pos:pos + length]), pos + length
    elif wire_type == 5:
      value, pos = struct.unpack_from('<I', buf, pos)[0], pos + 4
    else:
      raise ValueError(f'unsupported protobuf wire type {wire_type}')
    if pos > len(buf):
      raise ValueError('truncated protobuf message')
    fields.append((number, value))
  return fields


def _signed64(value: int) -> int:
  """int64 fields are varints of the two's complement."""
  return value - (1 << 64) if value >= 1 << 63 else value


# --- SSTable (LevelDB table format) --------------------------------------------------------

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # Two padded block handles (40 bytes) + the 8-byte magic.
_BLOCK_TRAILER_SIZE = 5  # Compression type byte + masked crc32c.


def _snappy_decompress(buf: bytes) -> bytes:
  """Decompresses one raw snappy block (literals and back-references)."""
  length, pos = _varint(buf, 0)
  out = bytearray()
  while pos < len(buf):
    tag = buf[pos]
    pos += 1
    kind = tag & 3
    if kind == 0:  # Literal; lengths over 60 follow the tag in 1-4 bytes.
      n = tag >> 2
      if n >= 60:
        extra = n - 59
        n = int.from_bytes(buf[pos:pos + extra], 'little')
        pos += extra
      out += buf[pos:pos + n + 1]
      pos += n + 1
      continue
    if kind == 1:
      n, offset = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | buf[pos]
      pos += 1
    elif kind == 2:
      n, offset = (tag >> 2) + 1, int.from_bytes(buf[pos:pos + 2], 'little')
      pos += 2
    else:
      n, offset = (tag >> 2) + 1, int.from_bytes(buf[pos:pos + 4], 'little')
      pos += 4
    if offset == 0 or offset > len(out):
      raise ValueError('corrupt snappy block: bad copy offset')
    for _ in range(n):  # Byte by byte: copies may overlap their own output.
      out.append(out[-offset])
  if len(out) != length:
    raise ValueError(f'corrupt snappy block: {len(out)} bytes, header says {length}')
  return bytes(out)


def _read_block(data: bytes, handle: tuple[int, int], path: str, verify: bool) -> bytes:
  """The contents of the block at handle (offset, size), checked and decompressed."""
  offset, size = handle
  end = offset + size + _BLOCK_TRAILER_SIZE
  if end > len(data):
    raise ValueError(f'{path} is truncated: a block ends at byte {end} of {len(data)}')
  contents = data[offset:offset + size]
  compression = data[offset + size]
  if verify:
    stored = struct.unpack_from('<I', data, offset + size + 1)[0]
    if _unmask_crc(stored) != crc32c(data[offset:offset + size + 1]):
      raise ValueError(f'{path} is corrupted: checksum mismatch in the block at byte {offset}')
  if compression == 0:
    return contents
  if compression == 1:
    return _snappy_decompress(contents)
  raise ValueError(f'{path}: unsupported block compression type {compression}')


def _block_entries(block: bytes, path: str) -> list[tuple[bytes, bytes]]:
  """(key, value) pairs of a block; keys share prefixes with their predecessor."""
  if len(block) < 4:
    raise ValueError(f'{path} is corrupted: a block is too short')
  num_restarts = struct.unpack_from('<I', block, len(block) - 4)[0]
  limit = len(block) - 4 - 4 * num_restarts
  if limit < 0:
    raise ValueError(f'{path} is corrupted: bad restart count in a block')
  entries, pos, key = [], 0, b''
  while pos < limit:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    value_len, pos = _varint(block, pos)
    if shared > len(key) or pos + unshared + value_len > limit:
      raise ValueError(f'{path} is corrupted: bad entry in a block')
    key = key[:shared] + block[pos:pos + unshared]
    pos += unshared
    entries.append((key, block[pos:pos + value_len]))
    pos += value_len
  return entries


def _block_handle(buf: bytes, pos: int = 0) -> tuple[tuple[int, int], int]:
  """Decodes a BlockHandle (varint offset, varint size)."""
  offset, pos = _varint(buf, pos)
  size, pos = _varint(buf, pos)
  return (offset, size), pos


def _read_sstable(path: str, verify_checksums: bool = True) -> list[tuple[bytes, bytes]]:
  """All (key, value) pairs of an SSTable file, in key order."""
  with open(path, 'rb') as f:
    data = f.read()
  if len(data) < _FOOTER_SIZE or struct.unpack_from('<Q', data, len(data) - 8)[0] != _TABLE_MAGIC:
    raise ValueError(f'{path} is not a TF checkpoint index: no SSTable magic number at its end')
  footer = data[len(data) - _FOOTER_SIZE:]
  try:
    _, pos = _block_handle(footer)  # The metaindex holds nothing a bundle needs.
    index_handle, _ = _block_handle(footer, pos)
    entries = []
    for _, handle in _block_entries(_read_block(data, index_handle, path, verify_checksums), path):
      block = _read_block(data, _block_handle(handle)[0], path, verify_checksums)
      entries.extend(_block_entries(block, path))
  except (ValueError, IndexError, struct.error) as e:
    if str(e).startswith(path):  # The helpers' own messages already name the file.
      raise
    raise ValueError(f'{path} is corrupted: {e}') from e
  return entries


# --- TensorBundle --------------------------------------------------------------------------

# types.proto DataType -> numpy dtype (little-endian, as bundles store them).
_DTYPES = {
    1: np.dtype('<f4'), 2: np.dtype('<f8'), 3: np.dtype('<i4'), 4: np.dtype('u1'),
    5: np.dtype('<i2'), 6: np.dtype('i1'), 8: np.dtype('<c8'), 9: np.dtype('<i8'),
    10: np.dtype('?'), 17: np.dtype('<u2'), 18: np.dtype('<c16'), 19: np.dtype('<f2'),
    22: np.dtype('<u4'), 23: np.dtype('<u8'),
}
_DTYPE_NAMES = {
    1: 'DT_FLOAT', 2: 'DT_DOUBLE', 3: 'DT_INT32', 4: 'DT_UINT8', 5: 'DT_INT16', 6: 'DT_INT8',
    7: 'DT_STRING', 8: 'DT_COMPLEX64', 9: 'DT_INT64', 10: 'DT_BOOL', 11: 'DT_QINT8',
    12: 'DT_QUINT8', 13: 'DT_QINT32', 14: 'DT_BFLOAT16', 15: 'DT_QINT16', 16: 'DT_QUINT16',
    17: 'DT_UINT16', 18: 'DT_COMPLEX128', 19: 'DT_HALF', 20: 'DT_RESOURCE', 21: 'DT_VARIANT',
    22: 'DT_UINT32', 23: 'DT_UINT64',
}


def _numpy_dtype(code: int, name: str) -> np.dtype:
  """The numpy dtype of a DataType enum value; bfloat16 comes from ml_dtypes (a jax dep)."""
  if code == 14:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return np.dtype(ml_dtypes.bfloat16)
  if code not in _DTYPES:
    label = _DTYPE_NAMES.get(code, 'unknown DataType')
    raise ValueError(f'variable {name!r} has unsupported dtype {label} ({code})')
  return _DTYPES[code]


def _parse_entry(name: str, value: bytes) -> dict:
  """Decodes a BundleEntryProto into dtype, shape, shard_id, offset, size, crc32c."""
  entry = {'dtype': 0, 'shape': [], 'shard_id': 0, 'offset': 0, 'size': 0, 'crc32c': None}
  for number, field in _proto_fields(value):
    if number == 1:
      entry['dtype'] = field
    elif number == 2:
      for dim_number, dim in _proto_fields(field):
        if dim_number == 2:  # TensorShapeProto.dim; Dim.size is field 1.
          sizes = [v for n, v in _proto_fields(dim) if n == 1]
          entry['shape'].append(_signed64(sizes[0]) if sizes else 0)
        elif dim_number == 3 and dim:
          raise ValueError(f'variable {name!r} has an unknown rank')
    elif number in (3, 4, 5):
      entry[{3: 'shard_id', 4: 'offset', 5: 'size'}[number]] = field
    elif number == 6:
      entry['crc32c'] = field
    elif number == 7:
      # Partitioned variables keep their data in separate slice entries; BERT has none.
      raise ValueError(f'variable {name!r} is partitioned (sliced); that is not supported')
  return entry


def _parse_header(value: bytes, path: str) -> int:
  """Checks the BundleHeaderProto; returns the number of data shards."""
  num_shards, endianness = 1, 0
  for number, field in _proto_fields(value):
    if number == 1:
      num_shards = field
    elif number == 2:
      endianness = field
  if endianness != 0:
    raise ValueError(f'{path}: big-endian checkpoints are not supported')
  return num_shards


def _data_path(prefix: str, shard: int, num_shards: int) -> str:
  """The data file of one shard, named as TF's BundleWriter names it."""
  return f'{prefix}.data-{shard:05d}-of-{num_shards:05d}'


def _check_files(prefix: str) -> None:
  """Names the missing files of a checkpoint, before anything is parsed."""
  index = prefix + '.index'
  if os.path.isfile(index):
    return
  # The shard count is in the index, so missing data files are caught when reading.
  raise FileNotFoundError(
      f'TF checkpoint {prefix!r} not found: missing {index}. Pass the prefix, e.g. '
      f'.../bert_model.ckpt for bert_model.ckpt.index + bert_model.ckpt.data-00000-of-00001.')


def read_tf_checkpoint(prefix: str, verify_checksums: bool = True) -> dict[str, np.ndarray]:
  """Every variable of the TF checkpoint at prefix, by name, as numpy arrays.

  Optimizer slots and global_step are returned too; the mapping decides what to skip.
  verify_checksums checks each tensor's stored crc32c (numpy: ~1.5 s per GB).
  """
  _check_files(prefix)
  index_path = prefix + '.index'
  entries = _read_sstable(index_path, verify_checksums)
  if not entries or entries[0][0] != b'':
    raise ValueError(f'{index_path} is not a TF checkpoint index: no bundle header entry')
  num_shards = _parse_header(entries[0][1], index_path)
  files = {}
  try:
    return {name: _read_tensor(name, entry, prefix, num_shards, files, verify_checksums)
            for name, entry in ((k.decode('utf-8'), v) for k, v in entries[1:])}
  finally:
    for f in files.values():
      f.close()


def _read_tensor(name: str, value: bytes, prefix: str, num_shards: int, files: dict,
                 verify: bool) -> np.ndarray:
  """Reads and checks one tensor's bytes from its data shard."""
  try:
    entry = _parse_entry(name, value)
  except (IndexError, TypeError, struct.error) as e:  # A field of the wrong wire type.
    raise ValueError(f'the index entry of variable {name!r} is corrupted: {e!r}') from e
  dtype = _numpy_dtype(entry['dtype'], name)
  shape = tuple(entry['shape'])
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if entry['size'] != expected:
    raise ValueError(f'variable {name!r}: the index says {entry["size"]} bytes, but shape '
                     f'{shape} of {dtype} needs {expected}')
  path = _data_path(prefix, entry['shard_id'], num_shards)
  if path not in files:
    if not os.path.isfile(path):
      raise FileNotFoundError(f'TF checkpoint {prefix!r}: missing data file {path} '
                              f'(needed by variable {name!r})')
    files[path] = open(path, 'rb')  # pylint: disable=consider-using-with
  f = files[path]
  f.seek(entry['offset'])
  buf = bytearray(entry['size'])
  if f.readinto(buf) != len(buf):
    raise ValueError(f'{path} is truncated: variable {name!r} needs bytes '
                     f'[{entry["offset"]}, {entry["offset"] + entry["size"]}) of '
                     f'{os.path.getsize(path)}')
  array = np.frombuffer(buf, np.uint8)
  if verify and entry['crc32c'] is not None and _unmask_crc(entry['crc32c']) != crc32c(array):
    raise ValueError(f'checksum mismatch for variable {name!r} in {path}: the checkpoint is '
                     f'corrupted')
  return array.view(dtype).reshape(shape).astype(dtype.newbyteorder('='), copy=False)


# --- original BERT names -> HuggingFace BertForPreTraining ---------------------------------

_LAYER = r'bert/encoder/layer_(\d+)/'
_HF_LAYER = r'bert.encoder.layer.\1.'

# (TF name pattern, HF name template, transpose). TF dense kernels are [in, out]; torch
# Linear weights are [out, in]. cls/seq_relationship/output_weights is already [2, hidden].
_NAME_TABLE = [
    (r'bert/embeddings/(word|position|token_type)_embeddings',
     r'bert.embeddings.\1_embeddings.weight', False),
    (r'bert/embeddings/LayerNorm/gamma', 'bert.embeddings.LayerNorm.weight', False),
    (r'bert/embeddings/LayerNorm/beta', 'bert.embeddings.LayerNorm.bias', False),
    (_LAYER + r'attention/self/(query|key|value)/kernel',
     _HF_LAYER + r'attention.self.\2.weight', True),
    (_LAYER + r'attention/self/(query|key|value)/bias', _HF_LAYER + r'attention.self.\2.bias',
     False),
    (_LAYER + r'attention/output/dense/kernel', _HF_LAYER + 'attention.output.dense.weight',
     True),
    (_LAYER + r'attention/output/dense/bias', _HF_LAYER + 'attention.output.dense.bias', False),
    (_LAYER + r'attention/output/LayerNorm/gamma',
     _HF_LAYER + 'attention.output.LayerNorm.weight', False),
    (_LAYER + r'attention/output/LayerNorm/beta', _HF_LAYER + 'attention.output.LayerNorm.bias',
     False),
    (_LAYER + r'(intermediate|output)/dense/kernel', _HF_LAYER + r'\2.dense.weight', True),
    (_LAYER + r'(intermediate|output)/dense/bias', _HF_LAYER + r'\2.dense.bias', False),
    (_LAYER + r'output/LayerNorm/gamma', _HF_LAYER + 'output.LayerNorm.weight', False),
    (_LAYER + r'output/LayerNorm/beta', _HF_LAYER + 'output.LayerNorm.bias', False),
    (r'bert/pooler/dense/kernel', 'bert.pooler.dense.weight', True),
    (r'bert/pooler/dense/bias', 'bert.pooler.dense.bias', False),
    (r'cls/predictions/transform/dense/kernel', 'cls.predictions.transform.dense.weight', True),
    (r'cls/predictions/transform/dense/bias', 'cls.predictions.transform.dense.bias', False),
    (r'cls/predictions/transform/LayerNorm/gamma', 'cls.predictions.transform.LayerNorm.weight',
     False),
    (r'cls/predictions/transform/LayerNorm/beta', 'cls.predictions.transform.LayerNorm.bias',
     False),
    (r'cls/predictions/output_bias', 'cls.predictions.bias', False),
    (r'cls/seq_relationship/output_weights', 'cls.seq_relationship.weight', False),
    (r'cls/seq_relationship/output_bias', 'cls.seq_relationship.bias', False),
]
_COMPILED_TABLE = [(re.compile(p), hf, t) for p, hf, t in _NAME_TABLE]

# Training state, not weights: the step counter and Adam's slots (the original BERT
# optimizer's adam_m/adam_v, tf.train.AdamOptimizer's Adam/Adam_1 and beta powers).
_SKIPPED = re.compile(r'global_step|.*/adam_[mv]|.*/Adam(_\d+)?|beta[12]_power')


def _hf_name(tf_name: str) -> tuple[str, bool] | None:
  """(HF name, transpose) for a TF weight name, or None when the table has no entry."""
  for pattern, template, transpose in _COMPILED_TABLE:
    match = pattern.fullmatch(tf_name)
    if match:
      return match.expand(template), transpose
  return None


def tf_to_hf_state_dict(tf_vars: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Renames original TF BERT variables to HF BertForPreTraining names and layouts.

  Skips global_step and optimizer slots; any other name the table lacks is an error.
  The tied MLM decoder weight is not emitted: HF ties it to the word embeddings.
  """
  state, unknown = {}, []
  for tf_name in sorted(tf_vars):
    if _SKIPPED.fullmatch(tf_name):
      continue
    mapped = _hf_name(tf_name)
    if mapped is None:
      unknown.append(tf_name)
      continue
    hf_name, transpose = mapped
    value = np.asarray(tf_vars[tf_name])
    if transpose:
      if value.ndim != 2:
        raise ValueError(f'{tf_name}: a dense kernel must be 2-D, got shape {value.shape}')
      value = np.ascontiguousarray(value.T)
    state[hf_name] = value
  if unknown:
    raise ValueError(f'{len(unknown)} TF variables have no BERT mapping: {", ".join(unknown)}')
  return state


# The original modeling.BertConfig's defaults, for configs that omit a key.
_TF_CONFIG_DEFAULTS = {
    'hidden_act': 'gelu', 'hidden_dropout_prob': 0.1, 'attention_probs_dropout_prob': 0.1,
    'max_position_embeddings': 512, 'type_vocab_size': 16, 'initializer_range': 0.02,
}
_TF_CONFIG_REQUIRED = ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
                       'intermediate_size')


def tf_config_to_hf_config(bert_config_json: dict) -> dict:
  """An HF BertConfig dict from an original bert_config.json (same key names).

  Note: 'gelu' in the original code is the tanh approximation; HF's 'gelu' is exact (erf).
  Like HF's own converter we keep the name; the difference is below 1e-3 per activation.
  """
  missing = [k for k in _TF_CONFIG_REQUIRED if k not in bert_config_json]
  if missing:
    raise ValueError(f'bert_config.json lacks {", ".join(missing)}')
  config = {k: bert_config_json[k] for k in _TF_CONFIG_REQUIRED}
  for key, default in _TF_CONFIG_DEFAULTS.items():
    config[key] = bert_config_json.get(key, default)
  # Extra keys of some releases (pooler_*, directionality) are unused by BERT's code.
  config.update(model_type='bert', layer_norm_eps=1e-12)
  return config


def _check_shapes(state: dict[str, np.ndarray], config: dict) -> None:
  """Catches a bert_config.json that does not belong to the checkpoint."""
  h, layers = config['hidden_size'], config['num_hidden_layers']
  expected = {
      'bert.embeddings.word_embeddings.weight': (config['vocab_size'], h),
      'bert.embeddings.position_embeddings.weight': (config['max_position_embeddings'], h),
      'bert.embeddings.token_type_embeddings.weight': (config['type_vocab_size'], h),
      f'bert.encoder.layer.{layers - 1}.intermediate.dense.weight':
          (config['intermediate_size'], h),
  }
  for name, shape in expected.items():
    actual = state[name].shape if name in state else None
    if actual != shape:
      raise ValueError(f'checkpoint does not match bert_config.json: {name} has shape {actual}, '
                       f'the config implies {shape}')
  if f'bert.encoder.layer.{layers}.output.dense.weight' in state:
    raise ValueError(f'checkpoint has more than the config\'s {layers} layers')


def load_tf_bert(prefix: str, verify_checksums: bool = True) -> tuple[dict[str, np.ndarray],
                                                                     dict]:
  """(HF state dict, HF config dict) of an original BERT checkpoint directory's prefix.

  Reads bert_config.json from the prefix's directory, as the original releases ship it.
  """
  config_path = os.path.join(os.path.dirname(os.path.abspath(prefix)), 'bert_config.json')
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f'missing {config_path}: original BERT checkpoints come with a '
                            f'bert_config.json beside bert_model.ckpt.*')
  with open(config_path, encoding='utf-8') as f:
    config = tf_config_to_hf_config(json.load(f))
  state = tf_to_hf_state_dict(read_tf_checkpoint(prefix, verify_checksums))
  _check_shapes(state, config)
  return state, config
