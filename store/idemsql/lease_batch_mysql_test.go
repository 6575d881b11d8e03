package idemsql_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/idemdriver"
	"github.com/idem-go/idem/store/idemsql"
)

// TestAcquireBatchMySQLElementFailsAlone: on MySQL each element of an
// AcquireBatch is its own Acquire (its own short transactions), so one
// that fails is that element's error, not the batch's. Element "a" (a
// new record) is acquired; element "b", an expired record whose row
// another transaction holds locked, waits for that lock until the
// server gives up (a lock wait timeout of 1 s on the store's
// connections). The batch returns no error of its own,
// "a" acquired as attempt 1 and b's error: reported as the batch's, it
// would leave "a" held by nobody until its lease ran out (the caller
// retries it later as attempt 2).
func TestAcquireBatchMySQLElementFailsAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idemsql.MySQL, envOptions{mysqlParams: map[string]string{"innodb_lock_wait_timeout": "1"}})
	fp := []byte("fp")
	if r := e.mustAcquire("c", "b", fp, time.Microsecond); !r.Acquired {
		t.Fatalf("first Acquire of b: %+v", r)
	}
	ctx := t.Context()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+e.table+` WHERE consumer = ? AND message_id = ? FOR UPDATE`, "c", "b").Scan(&one); err != nil {
		t.Fatal(err)
	}
	ps := []*idemdriver.AcquireParams{
		{Consumer: "c", MessageID: "b", Fingerprint: fp, Lease: time.Minute},
		{Consumer: "c", MessageID: "a", Fingerprint: fp, Lease: time.Minute},
	}
	res, errs, err := e.store.AcquireBatch(ctx, ps)
	if err != nil {
		t.Fatalf("AcquireBatch: batch error %v; want b's error alone", err)
	}
	if len(res) != 2 || len(errs) != 2 {
		t.Fatalf("AcquireBatch: %d results and %d errors for 2 elements", len(res), len(errs))
	}
	if !res[1].Acquired || res[1].Attempt != 1 || errs[1] != nil {
		t.Errorf("a: %+v, %v; want acquired as attempt 1", res[1], errs[1])
	}
	var me *mysql.MySQLError
	if !errors.As(errs[0], &me) || me.Number != 1205 || res[0].Acquired {
		t.Errorf("b: %+v, %v; want not acquired, the lock wait timeout (1205)", res[0], errs[0])
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if r := e.inspect("c", "a"); r.Attempt != 1 {
		t.Errorf("a's record: attempt %d; want 1", r.Attempt)
	}
}
