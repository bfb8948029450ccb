@fake-coderd @leader-election @serial
Feature: Two replicas, one leader
  An operator deployed with more than one replica elects a leader through a Lease, and only the
  leader creates, replaces or deletes provisioner keys. A leader that was paused in the middle
  of a pass (a frozen node, a long garbage collection) and wakes after its Lease passed to
  another replica must not finish that pass: its key requests would replace the key the new
  leader just made. A leader that stops hands its Lease over at once.

  The suite stops the operator, starts two replicas of it with leader election, the first
  alone so that the Lease holder identity it takes is known to be its own (POD_NAME is
  conformance-replica-a and -b), and starts the operator again afterwards.

  Background:
    Given a Ready control plane with operator access
    And the operator runs as two leader-elected replicas

  @R-KEY-4 @extended
  Scenario: A leader paused in the middle of a pass changes no key when it wakes
    When coderd delays its answers to every GET on "organization" by 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as coderd sees its GET on "organization"
    Then another replica takes over the Lease
    And the provisioner becomes Ready
    When the paused replica resumes
    Then coderd sees no provisioner key requests since the last action during the observation window
    And coderd saw exactly 1 POST on "provisionerkeys"
    And coderd saw no DELETE on "provisionerkey"
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    And the provisioner status records the key in Secret "{provisioner}-provisioner-key"

  # R-KEY-22's replacement deletes a key by name: a deposed leader that sent that DELETE after
  # waking would delete the key the new leader has just created under the same name.
  @R-KEY-4 @R-KEY-22 @extended
  Scenario: A leader paused before replacing a same-named key deletes nothing when it wakes
    Given a provisioner key named "coderprovisioner-sample" already exists in the scenario's organization
    When coderd delays its answers to every POST on "provisionerkeys" by 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as coderd sees its POST on "provisionerkeys"
    # checks: none
    Then another replica takes over the Lease
    # checks: R-KEY-22
    And the provisioner becomes Ready
    When the paused replica resumes
    # checks: R-KEY-4
    Then coderd sees no provisioner key changes since the last action during the observation window
    # checks: R-KEY-4, R-KEY-22
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"

  @R-KEY-4 @extended
  Scenario: A leader that stops hands its Lease over at once
    When the leader is stopped right after it renews its Lease
    Then another replica holds the Lease within 2 seconds of the stop
    When the sample provisioner is applied
    Then the provisioner becomes Ready
    And coderd saw exactly 1 POST on "provisionerkeys"

  # Whatever coderd's latency: the leader does not wait for an answer it will not use.
  @R-KEY-4 @extended
  Scenario: A leader stopped while coderd holds its key request hands its Lease over at once
    When coderd delays its answers to every POST on "provisionerkeys" by 6 seconds
    And the sample provisioner is applied
    And the leader is stopped as soon as coderd sees its POST on "provisionerkeys"
    Then another replica holds the Lease within 1 seconds of the stop
    And the provisioner becomes Ready
