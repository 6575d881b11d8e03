package idemdriver

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Limits on what stores keep.
const (
	// DefaultMaxIDLength is the longest message ID, in bytes, accepted by
	// default. Stores size their columns for it.
	DefaultMaxIDLength = 255
	// MaxConsumerNameLength is the longest consumer name, in bytes.
	MaxConsumerNameLength = 255
	// MaxFingerprintLength is the longest payload fingerprint, in bytes
	// (a SHA-512 digest).
	MaxFingerprintLength = 64
	// MaxStepNameLength is the longest recovery-point (step) name, in bytes.
	MaxStepNameLength = 255
)

// ValidateMessageID checks a message ID: 1 to max bytes (max <= 0 means
// DefaultMaxIDLength) of valid UTF-8 without control characters (C0, DEL,
// C1). IDs are compared byte for byte on every store, so nothing is
// trimmed, folded or normalised: an ID a store could not keep exactly is
// refused here instead. The error matches ErrMissingMessageID for "" and
// ErrInvalidMessageID otherwise, and says why.
func ValidateMessageID(id string, max int) error {
	if max <= 0 {
		max = DefaultMaxIDLength
	}
	if id == "" {
		return ErrMissingMessageID
	}
	if reason := checkText(id, max); reason != "" {
		return fmt.Errorf("%w: %s", ErrInvalidMessageID, reason)
	}
	return nil
}

// ValidateConsumerName checks a consumer name by the rules of message IDs,
// with MaxConsumerNameLength as the maximum. The error matches
// ErrInvalidConsumerName.
func ValidateConsumerName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty (a consumer name is mandatory)", ErrInvalidConsumerName)
	}
	if reason := checkText(name, MaxConsumerNameLength); reason != "" {
		return fmt.Errorf("%w: %s", ErrInvalidConsumerName, reason)
	}
	return nil
}

// ValidateFingerprint checks a payload fingerprint: 1 to
// MaxFingerprintLength bytes. The error matches ErrInvalidPayload.
func ValidateFingerprint(fp []byte) error {
	if len(fp) == 0 || len(fp) > MaxFingerprintLength {
		return fmt.Errorf("%w: fingerprint of %d bytes, want 1..%d", ErrInvalidPayload, len(fp), MaxFingerprintLength)
	}
	return nil
}

// ValidateStepName checks a recovery-point name by the rules of message
// IDs, with MaxStepNameLength as the maximum. The error matches
// ErrInvalidConfig.
func ValidateStepName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty step name", ErrInvalidConfig)
	}
	if reason := checkText(name, MaxStepNameLength); reason != "" {
		return fmt.Errorf("%w: step name: %s", ErrInvalidConfig, reason)
	}
	return nil
}

// ValidateLease checks a lease: positive, so a zero never means "no
// expiry". The error matches ErrInvalidConfig.
func ValidateLease(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: lease %v, want a positive duration", ErrInvalidConfig, d)
	}
	return nil
}

// ValidateToken checks a fencing token: positive, as every Acquire returns.
// A token that is not positive can own no record; the error matches
// ErrLeaseLost.
func ValidateToken(token int64) error {
	if token <= 0 {
		return fmt.Errorf("%w: fencing token %d is not one any attempt holds", ErrLeaseLost, token)
	}
	return nil
}

// ValidateKey checks a (consumer name, message ID) pair with the default
// maximum ID length.
func ValidateKey(consumer, messageID string) error {
	if err := ValidateConsumerName(consumer); err != nil {
		return err
	}
	return ValidateMessageID(messageID, 0)
}

// ValidateClaimParams checks p as every ClaimTx and BeginClaim does: a
// valid key and fingerprint, and a LockTimeout that is not negative.
func ValidateClaimParams(p *ClaimParams) error {
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	if err := validateLockTimeout(p.LockTimeout); err != nil {
		return err
	}
	return ValidateFingerprint(p.Fingerprint)
}

// validateLockTimeout refuses a negative lock timeout.
func validateLockTimeout(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: negative LockTimeout %v", ErrInvalidConfig, d)
	}
	return nil
}

// ValidateClaimBatchParams checks p as every ClaimBatchTx does: a valid
// consumer name, at least one message, a LockTimeout that is not negative,
// and for each a valid message ID and
// fingerprint, with no ID twice. The error names the first bad message.
func ValidateClaimBatchParams(p *ClaimBatchParams) error {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if len(p.Messages) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidConfig)
	}
	if err := validateLockTimeout(p.LockTimeout); err != nil {
		return err
	}
	seen := make(map[string]struct{}, len(p.Messages))
	for i, m := range p.Messages {
		if err := ValidateMessageID(m.MessageID, 0); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if err := ValidateFingerprint(m.Fingerprint); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if _, dup := seen[m.MessageID]; dup {
			return fmt.Errorf("%w: message ID %q appears twice in one batch", ErrInvalidConfig, m.MessageID)
		}
		seen[m.MessageID] = struct{}{}
	}
	return nil
}

// ValidateAcquireParams checks p as every Acquire does: a valid key and
// fingerprint, a positive lease (a zero lease never means "no expiry"),
// and a StepPrefix that is empty or makes valid step names with every
// token (ValidateStepName of the prefix and the longest token).
func ValidateAcquireParams(p *AcquireParams) error {
	if err := ValidateLease(p.Lease); err != nil {
		return err
	}
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.StepPrefix != "" {
		if err := validateStepPrefix(p.StepPrefix); err != nil {
			return fmt.Errorf("StepPrefix: %w", err)
		}
	}
	return ValidateFingerprint(p.Fingerprint)
}

// maxTokenDigits is the length of math.MaxInt64 in decimal, the longest
// token PrefixStep appends.
const maxTokenDigits = len("9223372036854775807")

// validateStepPrefix is ValidateStepName(PrefixStep(prefix,
// math.MaxInt64)), the longest step the prefix makes, with the same
// verdict and error text, without building that name: the digits a
// token adds are valid text, so only the prefix's bytes and the name's
// length can fail.
func validateStepPrefix(prefix string) error {
	if n := len(prefix) + maxTokenDigits; n > MaxStepNameLength {
		return fmt.Errorf("%w: step name: %d bytes, over the maximum of %d", ErrInvalidConfig, n, MaxStepNameLength)
	}
	if reason := checkText(prefix, MaxStepNameLength); reason != "" {
		return fmt.Errorf("%w: step name: %s", ErrInvalidConfig, reason)
	}
	return nil
}

// ValidateRenewParams checks p as every Renew does.
func ValidateRenewParams(p *RenewParams) error {
	if err := ValidateLease(p.Lease); err != nil {
		return err
	}
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	return ValidateToken(p.Token)
}

// ValidateCompleteParams checks p as every Complete does.
func ValidateCompleteParams(p *CompleteParams) error {
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	return ValidateToken(p.Token)
}

// ValidateReleaseParams checks p as every Release does: a valid key and
// token, and a Step that is empty or a valid step name.
func ValidateReleaseParams(p *ReleaseParams) error {
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	if p.Step != "" {
		if err := ValidateStepName(p.Step); err != nil {
			return err
		}
	}
	return ValidateToken(p.Token)
}

// ValidateStepParams checks p as every SaveStep does.
func ValidateStepParams(p *StepParams) error {
	if err := ValidateKey(p.Consumer, p.MessageID); err != nil {
		return err
	}
	if err := ValidateStepName(p.Step); err != nil {
		return err
	}
	return ValidateToken(p.Token)
}

// ValidateMarkRunningParams checks p as every MarkRunning does: a valid
// consumer name and a MaxGap that is not negative.
func ValidateMarkRunningParams(p *MarkRunningParams) error {
	if err := ValidateConsumerName(p.Consumer); err != nil {
		return err
	}
	if p.MaxGap < 0 {
		return fmt.Errorf("%w: negative MaxGap %v", ErrInvalidConfig, p.MaxGap)
	}
	return nil
}

// ValidateBeginPurgeParams checks p as every BeginPurge does.
func ValidateBeginPurgeParams(p *BeginPurgeParams) error {
	return ValidateConsumerName(p.Consumer)
}

// ValidateHorizon checks a purge horizon as every PurgeSession method
// that takes one does: it must be set. The error matches ErrInvalidConfig.
func ValidateHorizon(t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("%w: purge without a horizon", ErrInvalidConfig)
	}
	return nil
}

// ValidatePurgeBatchParams checks p as every PurgeSession.DeleteBatch
// does: a horizon that is set and a positive Limit.
func ValidatePurgeBatchParams(p *PurgeBatchParams) error {
	if err := ValidateHorizon(p.Horizon); err != nil {
		return err
	}
	if p.Limit <= 0 {
		return fmt.Errorf("%w: purge batch limit %d, want a positive number", ErrInvalidConfig, p.Limit)
	}
	return nil
}

// checkText returns why s is not a valid ID of at most max bytes, or "".
func checkText(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("%d bytes, over the maximum of %d", len(s), max)
	}
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !validRuneAt(s, i):
			return fmt.Sprintf("invalid UTF-8 at byte %d", i)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
			return fmt.Sprintf("control character %U at byte %d", r, i)
		}
	}
	return ""
}

// validRuneAt reports whether s[i:] starts with a real U+FFFD (three
// bytes) rather than an invalid byte decoded as RuneError.
func validRuneAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 3
}
