"""tests/kernel_sass_loop.py's reading of a SASS listing (no compiler needed)."""
from __future__ import annotations

from kernel_sass_loop import main_loop, opcode

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   IADD3 R2, R0, 0x1, RZ ;
        /*0030*/               @P0 BRA 0x20 ;
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x32x16.F32.BF16 R168, gdesc[UR56], RZ, !UPT, gsb0 ;
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/              @!P1 BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @!P2 BRA 0x40 ;
        /*0090*/                   EXIT ;
"""


def test_main_loop_is_the_longest_backward_branch():
    loop = main_loop(SASS)
    assert [opcode(t) for t in loop] == [
        "WARPGROUP.ARRIVE", "HGMMA.64x32x16.F32.BF16", "WARPGROUP.DEPBAR.LE",
        "BAR.SYNC.DEFER_BLOCKING", "BRA"]


def test_uniform_predicate_branch():
    """sm120's listing: the loop's branch takes a uniform predicate operand, and
    scheduling annotations follow the operands."""
    sass = (
        "        /*0000*/                   LDC R1, c[0x0][0x37c]       &wr=0x1   ?trans1;\n"
        "        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4  ?trans1;\n"
        "        /*0020*/                   BRA.U !UP0, 0x10            &req={1}  ?WAIT15_END_GROUP;\n"
        "        /*0030*/                   EXIT                        ?trans5;\n")
    assert [opcode(t) for t in main_loop(sass)] == ["HMMA.16816.F32.BF16", "BRA.U"]


def test_no_loop():
    assert main_loop("        /*0000*/                   EXIT ;\n") == []
