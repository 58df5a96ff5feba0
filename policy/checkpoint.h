/* policy/checkpoint.h: model checkpoints -- a directory with config.json and the parameters
 * as safetensors (one model.safetensors, or model-0000i-of-0000N.safetensors shards with
 * model.safetensors.index.json), spec/policy.md section 14.
 *
 * What this is: the mapping between arl_model_params and checkpoint keys, with full
 * checking on load (every expected tensor's name, dtype and shape; all problems reported in
 * one message), dtype conversion, A_log padding, and the K3 release's MXFP4 experts.
 * What this is not: the container format (policy/safetensors.h) or train state (optimizer
 * moments, RNG, data cursor live beside the checkpoint, written by learner/).
 *
 * Storage dtypes on save: every tensor F32 when the config's text_config.dtype is
 * "float32" (development configs); with "bfloat16", BF16 except the fp32 class of section
 * 1.4 (A_log, dt_bias, conv weights, o_norm, e_score_correction_bias), which stay F32.
 * A_log is always written zero-padded to ceil(H/128)*128 entries.
 *
 * Accepted on load: fp32-class tensors F32 only; every other tensor F32, BF16 or F16
 * (converted to fp32 exactly); A_log shaped [H] or [ceil(H/128)*128] (padded entries must
 * be 0); a routed expert's w1/w2/w3 either as ".weight" or as the release form
 * ".weight_packed" (U8, [out, in/2]) + ".weight_scale" (U8, [out, in/32]) decoded per
 * section 14.3.  Any non-finite value is an error naming the tensor.
 */
#ifndef ARL_POLICY_CHECKPOINT_H
#define ARL_POLICY_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "policy/config.h"
#include "policy/params.h"

/* At most this many names are listed per kind of problem in a load error ("and N more"). */
#define ARL_CHECKPOINT_MAX_LISTED 5

/* Check the tensors of the checkpoint at `dir` (a directory, or one .safetensors file)
 * against cfg without reading their data: names, dtypes and shapes.  Every missing,
 * unexpected and mis-shaped tensor is reported at once in one ARL_ERR_SHAPE message.
 * If dir holds a config.json whose config hash differs from cfg's, ARL_ERR_CONFIG. */
arl_status arl_checkpoint_verify(const char *dir, const arl_model_config *cfg);

/* arl_checkpoint_verify, then read every tensor into params (which must have been
 * allocated for cfg: arl_model_params_alloc).  On failure params may be partly written. */
arl_status arl_checkpoint_load(const char *dir, const arl_model_config *cfg,
                               arl_model_params *params);

/* Write config.json and the parameters into dir.  shard_bytes: maximum data bytes per
 * safetensors shard; 0 (or a checkpoint that fits) writes one model.safetensors.  A dir
 * that does not exist is written as a temporary sibling and renamed into place at the end;
 * in an existing dir each file is replaced atomically (temp file, fsync, rename) and
 * config.json is written last. */
arl_status arl_checkpoint_save(const char *dir, const arl_model_config *cfg,
                               const arl_model_params *params, uint64_t shard_bytes);

/* Replacing a checkpoint directory in one step (agentrl model init), so that at every moment
 * dir holds either the old complete checkpoint or the new complete one, and no file of the old
 * one stays beside the new one:
 *   arl_checkpoint_check_replaceable(dir)          before any work: may dir be replaced?
 *   arl_checkpoint_tmp_create(dir, tmp, cap)       a new empty directory beside dir
 *   arl_checkpoint_save(tmp, cfg, params, shard)   the new checkpoint, complete, into it
 *   arl_checkpoint_commit(tmp, dir, &old_files)    it takes dir's place; the old one is removed
 * and after a failure before the commit (or of it), arl_checkpoint_tmp_remove(tmp). */

/* ARL_OK when dir does not exist, or is a directory (not a symbolic link) of plain checkpoint
 * files only: config.json, model.safetensors, model.safetensors.index.json,
 * model-NNNNN-of-NNNNN.safetensors and temporary files of theirs (NAME.tmp-XXXXXX).  Anything
 * else (a file of a training checkpoint, a folder, a user's file) is ARL_ERR_STATE listing
 * those entries: replacing dir would remove them. */
arl_status arl_checkpoint_check_replaceable(const char *dir);

/* Make the new empty directory "DIR.tmp-XXXXXX" beside dir (dir's missing parents first) and
 * write its path into tmp (cap bytes; 1200 is enough for any dir this module accepts).
 * ARL_ERR_IO or ARL_ERR_FULL naming dir; ARL_ERR_ARG for a path too long for tmp. */
arl_status arl_checkpoint_tmp_create(const char *dir, char *tmp, size_t cap);

/* Remove tmp and the files in it (a directory of arl_checkpoint_tmp_create); errors ignored. */
void arl_checkpoint_tmp_remove(const char *tmp);

/* Remove from dir what a process killed in the middle of an atomic write left there: the entries
 * NAME.tmp-XXXXXX (arl_write_file_atomic's files, arl_checkpoint_tmp_create's directories) whose
 * NAME owned(NAME) accepts.  Only for a directory the caller holds (its run lock): the
 * temporary of another process's write in progress would go too.  *removed (may be NULL): how
 * many were removed; a missing dir (or a file there) holds none.  An entry that cannot be removed
 * (a directory of more than files, say) is a warning naming it; ARL_ERR_IO when dir cannot be
 * listed. */
arl_status arl_checkpoint_tmp_sweep(const char *dir, int (*owned)(const char *name),
                                    int64_t *removed);

/* Put the complete checkpoint directory tmp (arl_checkpoint_tmp_create's) in dir's place: when
 * dir does not exist, by rename(2); when it is a replaceable directory (see above: checked again
 * here), by exchanging the two in one step (renameat2 RENAME_EXCHANGE; on a file system without
 * it, dir is renamed aside to DIR.old-XXXXXX and tmp onto dir, which a crash between the two
 * leaves without dir, the old checkpoint whole in DIR.old-XXXXXX), then removing the old one
 * (a warning if that fails; the new one is in place).  The new directory takes the old one's
 * permissions.  *old_files (may be NULL): the files of the old checkpoint removed, -1 when dir
 * did not exist.  On error dir is as it was and tmp is still there (the caller removes it). */
arl_status arl_checkpoint_commit(const char *tmp, const char *dir, int64_t *old_files);

#endif
