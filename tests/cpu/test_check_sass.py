#!/usr/bin/env python3
"""tools/check_sass.py's order check on hand-made instruction lists: x loads
ahead of a group's weight copies pass; x loads behind or between them, a copy
group with none, or x loads left after the last group fail; strong loads
(mailbox state) and weight streams (.NA) are not x loads; groups without
copies are not judged. The fused consumer's two launch points: one before
the wait and one after its first polling load, or it fails. The on-chip
engine's head: bulk copies and mbarrier setup only. The fused consumer's
zero stores before the wait: allowed on a path that exits without waiting,
judged by control flow. The NVFP4 block conversion: no branch from the
scale's E4M3 conversion to the codes' store."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import check_sass  # noqa: E402

COPY = "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]"
X = "LDG.E.128 R4, desc[UR4][R6.64]"
COMMIT = "LDGDEPBAR"
WAIT = "ACQBULK"
MMA = "HMMA.16816.F32.BF16 R8, R12, R16, R8"


def prologue():
    return [COPY] * 2 + [COMMIT] + [COPY] * 2 + [COMMIT] + [WAIT]


class XBeforeCopies(unittest.TestCase):
    def check(self, body):
        code = prologue() + body
        return check_sass.x_after_copies(code, code.index(WAIT))

    def test_x_ahead_of_every_group_passes(self):
        body = ["LDG.E.STRONG.SYS R4, desc[UR4][R6.64]", X, X, "DEPBAR.LE SB0, 0x2", MMA, X, COPY, COPY, COMMIT,
                MMA, X, COPY, COPY, COMMIT, "BAR.SYNC.DEFER_BLOCKING 0x0"]
        self.assertIsNone(self.check(body))

    def test_x_behind_the_copies_fails(self):
        body = [X, MMA, X, COPY, COPY, COMMIT, MMA, COPY, COPY, X, COMMIT]
        self.assertIsNotNone(self.check(body))

    def test_x_between_the_copies_fails(self):
        self.assertIsNotNone(self.check([MMA, X, COPY, X, COPY, COMMIT]))

    def test_x_moved_past_its_own_commit_fails(self):
        # Each stage's x behind its copies and commit: it opens the next group
        # ahead of that group's copies, but the last stage's is left over.
        body = [X, MMA, COPY, COPY, COMMIT, X, MMA, COPY, COPY, COMMIT, X, "BAR.SYNC.DEFER_BLOCKING 0x0"]
        self.assertIsNotNone(self.check(body))

    def test_a_copy_group_without_x_fails(self):
        body = [X, MMA, X, COPY, COMMIT, MMA, COPY, COMMIT]
        self.assertIsNotNone(self.check(body))

    def test_strong_and_weight_loads_are_not_x(self):
        for load in ("LDG.E.STRONG.SYS R4, desc[UR4][R6.64]", "LDG.E.NA.128 R4, desc[UR4][R6.64]"):
            with self.subTest(load=load):
                self.assertIsNotNone(self.check([MMA, load, COPY, COMMIT]))

    def test_groups_without_copies_and_code_before_the_wait_are_not_judged(self):
        # The prologue's groups are copies alone (weights before the wait).
        self.assertIsNone(self.check([X, COMMIT, MMA, COMMIT]))


class LaunchPoints(unittest.TestCase):
    POLL = "LDG.E.128.STRONG.SYS R16, desc[UR36][R34.64]"
    EARLY, LATE = "@P0 PREEXIT", "@!P0 PREEXIT"

    def missing(self, code):
        return check_sass.launch_points_missing(code, code.index(WAIT))

    def test_both_points_pass(self):
        self.assertIsNone(self.missing([X, self.EARLY, WAIT, self.POLL, MMA, self.LATE, "STG.E.128 [R1], R4"]))

    def test_one_moved_or_missing_fails(self):
        self.assertEqual(self.missing([X, WAIT, self.EARLY, self.POLL, self.LATE]), "before the wait")
        self.assertEqual(self.missing([X, self.EARLY, WAIT, self.LATE, self.POLL]), "after the polls")
        self.assertEqual(self.missing([X, self.EARLY, WAIT, self.POLL]), "after the polls")
        self.assertEqual(self.missing([X, self.EARLY, WAIT, MMA, self.LATE]), "after the polls")
        # The stage word's 4-byte strong load is not a poll.
        self.assertEqual(self.missing([X, self.EARLY, WAIT, "LDG.E.STRONG.SYS R40, desc[UR36][R4.64+0x4]",
                                       self.LATE, self.POLL]), "after the polls")


class BulkBeforeWait(unittest.TestCase):
    """The on-chip engine's rule (BULK_BEFORE_WAIT) on listings shaped like
    its machine code: mbarrier init and fence, a block barrier, per stage an
    expect_tx and 16 copies in ELECT loops, the cluster arrive, a spill."""
    STAGE = (["SYNCS.ARRIVE.TRANS64 RZ, [UR31], R3"]
             + ["@P0 ELECT P1, URZ, PT", "UBLKCP.S.G [UR30], [UR18], UR5, desc[UR24]",
                "@P1 PLOP3.LUT P0, PT, P1, PT, PT, 0x8, 0x0", "@P0 BRA.U.ANY `(.L_x_296)"] * 16)
    HEAD = (["LDC R1, c[0x0][0x28]", "ULDC UR8, c[0x0][0x24]", "S2R R16, SR_TID.X", "FENCE.VIEW.ASYNC.S",
             "SYNCS.EXCH.64 URZ, [UR11], UR6", "BAR.SYNC.DEFER_BLOCKING 0x0"] + STAGE * 2
            + ["STL [R1+0x8], R0", "UCGABAR_ARV"])

    def test_copies_and_setup_pass(self):
        self.assertEqual(check_sass.bulk_head_violations(self.HEAD, 16), [])

    def test_too_few_copies_fail(self):
        self.assertEqual(len(check_sass.bulk_head_violations(self.HEAD, 33)), 1)
        no_copies = [i for i in self.HEAD if "UBLKCP" not in i]
        self.assertIn("0 bulk copies", check_sass.bulk_head_violations(no_copies, 16)[0])

    def test_loads_stores_waits_and_mmas_fail(self):
        for bad in ("@!P1 LDG.E.128 R24, desc[UR36][R4.64]", "LDS.128 R4, [R53]", "STS.128 [R5+0x300], R8",
                    "@!P0 STG.E.STRONG.SYS desc[UR36][R6.64+0x4], R5", "LDG.E.STRONG.SYS R4, desc[UR36][R4.64]",
                    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R46+URZ], R3", "HMMA.16816.F32.BF16 R48, R48, R24, RZ",
                    "STAS.128 [R2.64], R8", "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]"):
            with self.subTest(bad=bad):
                why = check_sass.bulk_head_violations(self.HEAD[:8] + [bad] + self.HEAD[8:], 16)
                self.assertEqual(len(why), 1, why)
                self.assertIn(bad, why[0])

    def test_opcode(self):
        self.assertEqual(check_sass.opcode("@!P0 LDG.E.128 R4, desc[UR4][R6.64]"), "LDG")
        self.assertEqual(check_sass.opcode("@UP1 UIADD3 UR5, UR5, 0x1, URZ"), "UIADD3")
        self.assertEqual(check_sass.opcode("@PT STL [R1], R52"), "STL")
        self.assertEqual(check_sass.opcode("ACQBULK"), "ACQBULK")


class ZeroStoresOffTheWait(unittest.TestCase):
    """Listings shaped like the swizzled consumer's on sm_100a: the pad CTAs'
    branch (a loop of zero stores ending in EXIT) laid out ahead of the wait."""
    CONSUMER = "_ZN12spark_decode7kernels18gather_norm_kernelILi2EEEvNS0_14GatherNormArgsE"
    ZERO = "@P0 STG.E.128 desc[UR36][R2.64], RZ"

    def listing(self, store=ZERO, end="EXIT"):
        code = ["LDC R1, c[0x0][0x37c]", "@P0 BRA `(.L_x_0)", "@P0 EXIT",
                "ISETP.GE.AND P0, PT, R2, UR5, PT", store, "@!P0 BRA `(.L_x_1)", end,
                "LDG.E.128 R28, desc[UR36][R4.64]", "@P0 PREEXIT", WAIT, "STG.E.128 desc[UR36][R6.64], R8"]
        labels = {".L_x_1": 3, ".L_x_0": 7}
        return code, labels, code.index(WAIT)

    def forbidden(self, fn=CONSUMER, **kw):
        code, labels, wait = self.listing(**kw)
        return check_sass.head_stores(fn, code, labels, wait)

    def test_zeros_on_a_path_that_exits_pass(self):
        self.assertEqual(self.forbidden(), [])
        code, labels, wait = self.listing()
        self.assertEqual(check_sass.on_path_to(code, labels, wait), {0, 1, 7, 8})

    def test_a_store_of_data_fails(self):
        self.assertEqual(len(self.forbidden(store="@P0 STG.E.128 desc[UR36][R2.64], R8")), 1)

    def test_zeros_on_the_path_to_the_wait_fail(self):
        # The pad loop falls through into the wait instead of exiting.
        self.assertEqual(self.forbidden(end="NOP"), [self.ZERO])

    def test_other_kernels_keep_the_plain_rule(self):
        self.assertEqual(self.forbidden(fn="_ZN12spark_decode7kernels21mailbox_gather_kernelEv"), [self.ZERO])

    def test_flow_it_cannot_tell_counts_every_store(self):
        self.assertEqual(self.forbidden(end="BRX R4 -0x40"), [self.ZERO])

    def test_labels_are_read_from_the_listing(self):
        sass = (".text._Z1fv:\n        /*0000*/                   @P0 BRA `(.L_x_0) ;\n"
                "        /*0010*/                   EXIT ;\n.L_x_0:\n        /*0020*/                   ACQBULK ;\n")
        self.assertEqual(check_sass.functions(sass), {"_Z1fv": (["@P0 BRA `(.L_x_0)", "EXIT", "ACQBULK"],
                                                                {".L_x_0": 2})})


class BranchFreeQuantizer(unittest.TestCase):
    SCALE = "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R16, RZ, R17, RZ"
    STORE = "STG.E.64 desc[UR36][R2.64], R8"

    def test_straight_line_conversion_passes(self):
        code = ["MUFU.RSQ R10, R10", self.SCALE, "FSEL R29, R14, 0.5, !P5", "FFMA R29, R24, R29, R31",
                "SEL R13, R13, 0x7, !P3", self.STORE, "@P0 BRA `(.L_x_3)", "EXIT"]
        self.assertEqual(check_sass.quantizer_branches(code), [])

    def test_a_branch_per_value_fails(self):
        code = [self.SCALE, "BSSY B0, `(.L_x_1)", "ISETP.GT.U32.AND P0, PT, R21, 0x7f800000, PT",
                "@P0 BRA `(.L_x_1)", "FSETP.GE.AND P2, PT, R21, 0.75, PT", "BSYNC B0", self.STORE]
        self.assertEqual(len(check_sass.quantizer_branches(code)), 2)

    def test_no_scale_conversion_is_reported(self):
        self.assertIsNone(check_sass.quantizer_branches(["FMUL R1, R2, R3", self.STORE]))


if __name__ == "__main__":
    unittest.main()
