package riverdb

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/riverqueue/river"
)

// What becomes of each field of River's configuration, of the parameters
// of one insert, and of the driver methods River's insert reaches, when a
// job is staged instead of inserted. Every field is classified
// (TestConfigFieldsClassified, TestJobInsertParamsClassified,
// TestDriverOverrides fail on one that is not), so a River upgrade that
// adds or renames one fails here and says what moved.
type fate int

const (
	// applied: given to the staging client; River applies it at staging
	// exactly as InsertTx applies it.
	applied fate = iota + 1
	// copied: River's value is carried into staged_jobs and written by the
	// move.
	copied
	// refused: staging cannot honour it; setting it is an error, never
	// silently dropped.
	refused
	// notInsert: it shapes River's workers, maintenance or listener, not an
	// insert; a Stager leaves it out.
	notInsert
)

// configFate classifies river.Config's fields for a Stager.
var configFate = map[string]fate{
	"Hooks":                 applied, // HookInsertBegin runs and may refuse the job
	"JobInsertMiddleware":   applied, // deprecated home of insert middleware, still run
	"Logger":                applied,
	"MaxAttempts":           applied,
	"Middleware":            applied, // its JobInsertMiddleware run
	"Plugins":               applied, // hooks and middleware, the non-deprecated home
	"SkipJobKindValidation": applied, // checked against Workers' kinds
	"SkipUnknownJobCheck":   applied,
	"Test":                  applied, // DisableUniqueEnforcement; a stubbed Time sets CreatedAt, which Capture refuses
	"Workers":               applied, // a kind without a worker is refused, as InsertTx refuses it

	// The enqueuer writes River in the schema its role resolves first
	// (the River schema gate): a job meant for another schema would land
	// in that one.
	"Schema": refused,

	"AdvisoryLockPrefix":          notInsert,
	"CancelledJobRetentionPeriod": notInsert,
	"CompletedJobRetentionPeriod": notInsert,
	"DiscardedJobRetentionPeriod": notInsert,
	"ErrorHandler":                notInsert,
	"FetchCooldown":               notInsert, // also paces InsertTx's notification; the move sends its own
	"FetchOnlyKnownKinds":         notInsert,
	"FetchPollInterval":           notInsert,
	"ID":                          notInsert,
	"JobCleanerTimeout":           notInsert,
	"JobStuckHandler":             notInsert,
	"JobStuckThreshold":           notInsert,
	"JobTimeout":                  notInsert,
	"LeaderElectionDisabled":      notInsert,
	"PeriodicJobs":                notInsert, // inserted by River's leader, not staged
	"PollOnly":                    notInsert,
	"Queues":                      notInsert,
	"ReindexerIndexNames":         notInsert,
	"ReindexerSchedule":           notInsert,
	"ReindexerTimeout":            notInsert,
	"RescueStuckJobsAfter":        notInsert,
	"RetryPolicy":                 notInsert,
	"SoftStopTimeout":             notInsert,
	"TestOnly":                    notInsert,
	"WorkerMiddleware":            notInsert,
}

// StagingConfig is the configuration of the River client a Stager stages
// through, from the configuration of the API's River client: the fields
// that shape an insert, which River then applies at staging as InsertTx
// would. It returns an error naming every field cfg sets that staging
// cannot honour (and any field River added that idemd has not classified),
// instead of dropping it. cfg may be nil.
func StagingConfig(cfg *river.Config) (*river.Config, error) {
	out := &river.Config{}
	if cfg == nil {
		return out, nil
	}
	in, to := reflect.ValueOf(cfg).Elem(), reflect.ValueOf(out).Elem()
	var problems []string
	for i := range in.NumField() {
		f := in.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		switch configFate[f.Name] {
		case applied:
			to.Field(i).Set(in.Field(i))
		case notInsert:
		case refused:
			if !in.Field(i).IsZero() {
				problems = append(problems, f.Name+" is set, and staging cannot honour it")
			}
		default:
			if !in.Field(i).IsZero() {
				problems = append(problems, f.Name+" is set, and this idemd does not know whether it shapes an insert")
			}
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", errConfigRefused, strings.Join(problems, "; "))
	}
	return out, nil
}

var errConfigRefused = errors.New("river.Config refused for staging")
