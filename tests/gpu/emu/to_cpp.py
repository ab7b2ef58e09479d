#!/usr/bin/env python3
"""to_cpp.py - rewrite a kernels/cuda/*.cu file for the CPU emulation: every
`kernel<<<grid, block, smem, stream>>>(args);` becomes
`EMU_LAUNCH((grid, block, smem, stream), kernel, (args));` (the shim copies
the arguments at the launch). Usage: to_cpp.py IN OUT"""
import re
import sys

src = open(sys.argv[1]).read()
pat = re.compile(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);', re.S)
out, n = pat.subn(lambda m: 'EMU_LAUNCH((%s), %s, (%s));' % (m.group(2), m.group(1), m.group(3)), src)
if '<<<' in out:
    sys.exit('to_cpp.py: launch left unconverted in ' + sys.argv[1])
open(sys.argv[2], 'w').write('// generated from %s by tests/gpu/emu/to_cpp.py\n' % sys.argv[1] + out)
print('%s: %d launches' % (sys.argv[1], n))
